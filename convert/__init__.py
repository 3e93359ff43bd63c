"""clover_cpu.convert: Hugging Face checkpoints to GGUF (installed from the repository's convert/)."""
