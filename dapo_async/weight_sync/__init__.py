"""Weight sync: learner rank 0 → generators. ``dist``: a torch.distributed group separate from
the training world (gloo on CPU, NCCL on GPU); ``disk``: safetensors snapshots + version marker."""
