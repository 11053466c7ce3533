"""Where a model's weights come from: models.py (the bundled model, local directories, the
resolver), hub.py (Hugging Face ids into the hub cache), prefetch.py (the init container that
downloads them before a replica starts), adapters.py (LoRA adapter directories), errors.py."""
