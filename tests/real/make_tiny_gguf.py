"""Write a tiny random-weight Llama model as a GGUF file that llama.cpp's server loads.

    python make_tiny_gguf.py OUTPUT.gguf

Nothing is downloaded: the file is written with the `gguf` package (llama.cpp's own GGUF
writer, from PyPI). Architecture `llama`, 2 layers, width 128, 4 attention heads (2 KV heads),
float32 weights from a fixed seed, and a SentencePiece-style vocabulary (`tokenizer.ggml.model`
`llama`): `<unk>`, `<s>`, `</s>`, the 256 byte tokens `<0x00>`…`<0xFF>` (llama.cpp's byte
fallback needs them), then `▁`, the letters, and every prefix of a few words (`▁a`, `▁ag`, …,
`▁agent`) so each word in WORDS is one token. The output layer gives the special and byte
tokens a logit of 0 against word logits of about ±11, so generation picks whole words: every
generated token is complete text (one stream chunk each) and never end-of-sequence.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# The knee sweep's prompt words (kneepoint/knee/sweep.py PROMPT_WORDS) and a few more.
WORDS = (
    "the of and a to is agent tool call result file search read write plan step system "
    "prompt cache token user assistant you are with tools"
).split()
LAYERS, WIDTH, HEADS, KV_HEADS, FFN, CONTEXT = 2, 128, 4, 2, 256, 4096
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # gguf.TokenType


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [UNKNOWN, CONTROL, CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [BYTE] * 256
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz"]
    for word in WORDS:
        for end in range(2, len(word) + 2):
            piece = "▁" + word[: end - 1]
            if piece not in pieces:
                pieces.append(piece)
    tokens += pieces
    types += [NORMAL] * len(pieces)
    # SentencePiece merges the pair whose result scores highest: longer pieces first.
    scores = [0.0] * (3 + 256) + [float(len(piece)) for piece in pieces]
    return tokens, scores, types


def main(output: Path) -> None:
    import gguf

    tokens, scores, types = vocabulary()
    vocab = len(tokens)
    head = WIDTH // HEADS
    rng = np.random.default_rng(0)

    def weights(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(output), "llama")
    writer.add_name("kneepoint-tiny")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    writer.add_tensor("token_embd.weight", weights(vocab, WIDTH, scale=1.0))
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weights(WIDTH, WIDTH))
        writer.add_tensor(f"{block}.attn_k.weight", weights(KV_HEADS * head, WIDTH))
        writer.add_tensor(f"{block}.attn_v.weight", weights(KV_HEADS * head, WIDTH))
        writer.add_tensor(f"{block}.attn_output.weight", weights(WIDTH, WIDTH))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(WIDTH, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(FFN, WIDTH))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(FFN, WIDTH))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(WIDTH, FFN))
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, dtype=np.float32))
    # Logits of the normalized state (each element about ±1): about ±11 for words, 0 for the
    # special and byte tokens, so sampling never lands on those.
    output_weights = weights(vocab, WIDTH, scale=1.0)
    output_weights[[i for i, kind in enumerate(types) if kind != NORMAL]] = 0.0
    writer.add_tensor("output.weight", output_weights)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
