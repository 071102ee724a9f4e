"""One-line integrations with training frameworks, imported on use.

`trackway.integrations.huggingface` (transformers `Trainer`), `trackway.integrations.lightning`
(Lightning `Trainer`) and `trackway.integrations.accelerate` (Hugging Face `accelerate`). The SDK
core never imports a framework; importing one of these modules does.
"""
