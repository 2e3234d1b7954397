"""Build a tiny random-weight Llama model that vLLM's CPU build can serve.

Run with the vLLM environment's Python (it has torch, transformers and tokenizers):
    python make_tiny_model.py OUTPUT_DIR [LAYERS HEADS]
Nothing is downloaded: the tokenizer is a byte-level BPE trained here on generated text.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def main(output: Path, layers: int = 2, heads: int = 2) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    output.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    words = [
        "agent",
        "tool",
        "call",
        "result",
        "system",
        "prompt",
        "cache",
        "token",
        "the",
        "of",
        "and",
        "a",
        "to",
        "is",
        "step",
        "plan",
        "search",
        "file",
        "read",
        "write",
    ]
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(40)) for i in range(400)]
    special = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(output)

    config = LlamaConfig(
        vocab_size=len(wrapped),
        hidden_size=64 * heads,
        intermediate_size=128 * heads,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=wrapped.bos_token_id,
        eos_token_id=wrapped.eos_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(output)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *(int(arg) for arg in sys.argv[2:]))
