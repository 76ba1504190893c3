"""What runs in a trainer pod: the entry point (`evokube-train`), the manifest check (which
`evokube validate` shares), the run settings, multi-host start-up, checkpoints, metrics and status
reports. The laptop's tools are in `evokube_trainer.laptop`, which nothing here imports."""
