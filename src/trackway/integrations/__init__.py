"""One-line integrations with training frameworks, imported on use.

`trackway.integrations.huggingface` (transformers `Trainer`) and `trackway.integrations.lightning`
(Lightning `Trainer`). The SDK core never imports a framework; importing one of these modules does.
"""
