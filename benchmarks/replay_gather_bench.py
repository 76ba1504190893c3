"""Replay sampling's cost per row on the device: what bounds the seeds axis of the RL workflows.

`python -m benchmarks.replay_gather_bench [--capacity 1000000] [--batch 1024] [--draws 128]
[--replicas 8] [--widths 1 3 10 16 128]`

Draws `draws` batches of `batch` rows at once, as the RL update loops draw a generation's
batches ahead (`agents.base.scan_sampled_updates`; the defaults are CEM-RL's: 128 critic steps
of 4 actors x 256), with `ReplayBuffer.sample` itself from a full buffer of `capacity`:

* `one field [C, w]`: one replica, a buffer of one leaf `w` floats wide (does a row's width
  matter, or only the number of rows?);
* `transition`: one replica, TD3's `Transition` (obs and next_obs `obs-dim` wide, action, reward
  and the two flags: one gather per field);
* `replicas batched` / `replicas in turn`: `replicas` buffers of transitions vmapped as
  `Workflow.seeds` vmaps them, sampled as one gather batched over the buffers or one buffer
  after another (`ReplayBuffer.replicas_in_turn`).

Each time is the median of `repeats` calls of the jitted draw after one untimed call (compile),
dispatch included; "ns / row" divides it by every replica's rows (fields of a transition count
once).
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks._common import load, print_header, print_row


def median_ms(fn, *args, repeats: int) -> float:
    """The median wall milliseconds of `fn(*args)` (jitted, synced) after one untimed call."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1024, help="rows a draw")
    parser.add_argument("--draws", type=int, default=128, help="batches drawn at once")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 3, 10, 16, 128])
    parser.add_argument("--obs-dim", type=int, default=3, help="Pendulum's")
    parser.add_argument("--action-dim", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from evokube_trainer.replay import ReplayBuffer, Transition

    def full(buffer: ReplayBuffer, example):
        state = buffer.init(example)
        return state.replace(size=jnp.asarray(buffer.capacity, jnp.int32))

    def draw_ahead(buffer: ReplayBuffer):
        """Every draw's batch `[draws, batch, ...]` from one replica's buffer."""
        return lambda state, key: jax.vmap(lambda k: buffer.sample(state, k))(
            jax.random.split(key, args.draws)
        )

    transition = Transition.zeros(args.obs_dim, args.action_dim)
    key = jax.random.key(0)
    rows = args.draws * args.batch
    device = jax.devices()[0]
    print(f"load {load():.2f}, {device.platform} {device.device_kind}")
    print_header("layout", "replicas", "rows", "ms", "ns / row")
    buffer = ReplayBuffer(args.capacity, args.batch)
    one = jax.jit(draw_ahead(buffer))
    for width in args.widths:
        state = full(buffer, {"field": jnp.zeros(width)})
        ms = median_ms(one, state, key, repeats=args.repeats)
        print_row(f"one field [C, {width}]", 1, f"{rows:,}", f"{ms:.3f}", f"{1e6 * ms / rows:.1f}")
        del state
    state = full(buffer, transition)
    ms = median_ms(one, state, key, repeats=args.repeats)
    print_row("transition", 1, f"{rows:,}", f"{ms:.3f}", f"{1e6 * ms / rows:.1f}")
    del state
    all_rows = args.replicas * rows
    keys = jax.random.split(key, args.replicas)
    for name, in_turn in (("replicas batched", False), ("replicas in turn", True)):
        buffer = ReplayBuffer(args.capacity, args.batch, replicas_in_turn=in_turn)
        states = jax.vmap(lambda _, b=buffer: full(b, transition))(jnp.arange(args.replicas))
        ms = median_ms(jax.jit(jax.vmap(draw_ahead(buffer))), states, keys, repeats=args.repeats)
        print_row(name, args.replicas, f"{all_rows:,}", f"{ms:.3f}", f"{1e6 * ms / all_rows:.1f}")
        del states


if __name__ == "__main__":
    main()
