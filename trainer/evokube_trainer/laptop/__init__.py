"""The `evokube` command and the tools behind it, run on a user's machine, never in a pod:
`cli.py` (the entry point), `local.py` (`evokube run`), `curves.py` (`evokube curve`). They
build on the layers below (runtime, policies); nothing below imports them."""


def checks_on_cpu() -> None:
    """Pin this process's JAX to the CPU before checking a manifest: checking needs no
    accelerator, and importing the environments computes on JAX's default device, which on a
    TPU (one process at a time may hold its chip) would take the chip from the trainers the
    command starts, or from a run beside it. The children's environment is left alone."""
    import jax

    jax.config.update("jax_platforms", "cpu")
