"""The fleet twin: simulated vLLM (or SGLang) replicas and dcgm-exporters that behave like the
real ones.

Behaviour comes from physics: a paged KV cache with prefix caching, continuous batching,
preemption by recompute, chunked prefill, and step times from bytes moved and FLOPs done on a
GPU profile. The twin stands in for GPUs in the demo and for what-ifs, never for a real vLLM
in a test that a real vLLM can do.
"""
