"""Checkpoints: written, committed, found, verified, retained and removed so that a resume is boring.

    protocol     the storage protocol (writing → committed → superseded → deleted; corrupt set aside)
    retention    what to keep, supersede and delete, as a plan that `trackway gc --dry-run` prints
    torch_state  a PyTorch checkpoint's content, loaded with weights_only
    async_save   saving while training continues
    manager      `run.checkpoints` in the SDK
    mirror       the ledger's copy of what storage holds (storage is the truth)

Nothing is imported here, so `import trackway.checkpoints.protocol` never pulls in torch.
"""
