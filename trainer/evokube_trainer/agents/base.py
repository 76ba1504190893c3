"""What every RL agent (TD3, SAC) offers the ERL learners, and the small pieces they share.

`Agent` is the protocol `workflows._learners` programs against, so one learner class serves
every agent:

* the deployable policy that EC evolves: `init_actor_params(key)` builds one actor's parameter
  pytree (the population member, once flattened), `policy(params, obs)` is its deterministic
  action in [-1, 1], and `explore(params, obs, noise, scale)` its exploratory action, given
  standard normal `noise` drawn by the rollout; `scale` 0 is `policy`, and
  `exploration_scale` is the scale an RL actor's own rollouts use (TD3: the std of additive
  Gaussian noise; SAC: 1, a sample of the stochastic actor);
* K independent agents (ERL): `init(key)` and `update_many(state, ...)` on one agent's state,
  which the learner vmaps; the state exposes the actor's parameters as `state.actor.params`;
* K actors, one critic (CEM-RL): `init_critic(key)` (everything the actors share),
  `actor_state_from_params(params)` (wraps a population member for training; `.params` reads
  it back) and `shared_update(critic, actors, step, batches, key, actor_step)`, one gradient
  step (`actor_step` and `actor_period`: `scan_updates`) of the
  critic side and of the K actors (leaves `[K, ...]`) on their K batches. Its metrics include
  `actor_loss` and `actor_updated` (0/1: whether the actors took a step, TD3 delays them);
* K agents with their own hyperparameters (PBT): `hyperparameters` names what may vary per
  member (with this config's values), `with_hyperparameters(state, values)` writes them into
  one agent's state (the Adam learning rates live in the optimizer states, see `adam`), and
  `exploration_scale_of(values)` is the `explore` scale they give.

`ActorCritic` is the structure both agents share: (config, obs_dim, action_dim), twin critics
(`TwinCritic`), Adam optimizers, the TD loss and `update_many`, the replay scan of `update`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from evokube_trainer.agents.networks import TwinCritic
from evokube_trainer.replay import ReplayBuffer, ReplayState, Transition

__all__ = [
    "DRAW_AHEAD_BYTES",
    "ActorCritic",
    "Agent",
    "actor_branch",
    "adam",
    "additive_noise",
    "apply_gradients",
    "scan_sampled_updates",
    "scan_updates",
    "soft_update",
    "with_learning_rate",
]

Array = jax.Array
Params = Any
Metrics = dict[str, Array]
_State = TypeVar("_State")

# The most bytes of replay batches one learner draws ahead (`scan_sampled_updates`): CEM-RL's
# shared critic in one call, ERL's and PBT's K agents a K-th each (they run vmapped, so the
# budget is split, not multiplied), at least one step (or block) each; every seed replica has
# its own. CEM-RL on Pendulum fits whole (128 steps x 4 actors x 256 rows x 40 bytes = 5 MiB),
# on Brax halfcheetah in 4 chunks (172-byte rows).
DRAW_AHEAD_BYTES = 8 * 2**20


class Agent(Protocol):
    """An RL agent as the ERL learners use it; see the module docstring."""

    @property
    def exploration_scale(self) -> float: ...

    @property
    def hyperparameters(self) -> Mapping[str, float]: ...

    def with_hyperparameters(self, state: Any, values: Mapping[str, Array]) -> Any: ...

    def exploration_scale_of(self, values: Mapping[str, Array]) -> Array: ...

    def init_actor_params(self, key: Array) -> Params: ...

    def policy(self, actor_params: Params, obs: Array) -> Array: ...

    def explore(self, actor_params: Params, obs: Array, noise: Array, scale: Array) -> Array: ...

    def init(self, key: Array) -> Any: ...

    def update_many(
        self,
        state: Any,
        buffer_state: ReplayState,
        buffer: ReplayBuffer,
        key: Array,
        num_updates: int,
        prepare: Callable[[Transition], Transition] | None = None,
        draw_ahead_bytes: int = DRAW_AHEAD_BYTES,
    ) -> tuple[Any, Metrics]: ...

    def init_critic(self, key: Array) -> Any: ...

    def actor_state_from_params(self, params: Params) -> Any: ...

    @property
    def actor_period(self) -> int: ...

    def shared_update(
        self,
        critic: Any,
        actors: Any,
        step: Array,
        batches: Transition,
        key: Array,
        actor_step: bool | None = None,
    ) -> tuple[Any, Any, Metrics]: ...


def scan_updates(
    update: Callable[[Any, Any, bool | None], tuple[Any, Metrics]],
    carry: Any,
    xs: Any,
    period: int,
) -> tuple[Any, Metrics]:
    """`update(carry, x, actor_step)` once per row of `xs` (a pytree, leaves `[U, ...]`: the
    steps' keys, with their batches when drawn ahead), as one `lax.scan`; the metrics stacked
    `[U, ...]`.

    An agent whose actors step once every `period` critic steps (TD3) decides from its step
    count with a `lax.cond`, which under a `vmap` (ERL's K agents, a run's seeds) becomes a
    select: the actor step computed on every step and dropped on most. When `period` divides
    U, the steps run instead in blocks of `period` whose last takes the actor step, decided
    here (`actor_step` True/False): the same schedule, since the carried step count is a
    multiple of U (hence of `period`) whenever the learners call this (a generation trains all
    U steps or none). Otherwise `actor_step` is None and the agent decides."""
    count = jax.tree.leaves(xs)[0].shape[0]
    if period <= 1 or count % period:
        return jax.lax.scan(lambda c, x: update(c, x, None), carry, xs)

    def block(carry, block_xs):  # [period, ...]
        head = jax.tree.map(lambda x: x[:-1], block_xs)
        carry, critic_only = jax.lax.scan(lambda c, x: update(c, x, False), carry, head)
        carry, last = update(carry, jax.tree.map(lambda x: x[-1], block_xs), True)
        return carry, jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), critic_only, last)

    carry, metrics = jax.lax.scan(block, carry, _split_leading(xs, period))
    return carry, jax.tree.map(lambda m: m.reshape(count, *m.shape[2:]), metrics)


def scan_sampled_updates(
    update: Callable[[Any, Array, Any, bool | None], tuple[Any, Metrics]],
    carry: Any,
    keys: Array,
    period: int,
    draw: Callable[[Array], Any],
    max_bytes: int = DRAW_AHEAD_BYTES,
) -> tuple[Any, Metrics]:
    """`scan_updates` of `update(carry, key, batch, actor_step)` with `batch = draw(key)` for
    each step's key of `keys` `[U]`, the batches drawn ahead of the steps that use them.

    Drawing a step's replay batch inside the update loop made U small gathers from the buffer
    (and, with the buffer split over devices, U collectives); drawn ahead it is one gather per
    chunk of steps, the same rows bitwise (each step's batch still comes from its own key; the
    updates agree to float rounding, as XLA fuses the loop differently). Chunks hold at most
    `max_bytes` of batches (at least one step, a whole block of `period` steps when `period`
    divides U), so a large batch size does not hold every step's rows."""
    count = keys.shape[0]
    one_key = jax.ShapeDtypeStruct(keys.shape[1:], keys.dtype)
    step_bytes = sum(
        leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(jax.eval_shape(draw, one_key))
    )
    chunk = draw_ahead_steps(count, period, max_bytes // max(step_bytes, 1))

    def run_chunk(carry, chunk_keys):  # [chunk]
        batches = jax.vmap(draw)(chunk_keys)  # [chunk, ...]
        return scan_updates(
            lambda c, x, actor_step: update(c, x[0], x[1], actor_step),
            carry,
            (chunk_keys, batches),
            period,
        )

    if chunk == count:
        return run_chunk(carry, keys)
    carry, metrics = jax.lax.scan(run_chunk, carry, _split_leading(keys, chunk))
    return carry, jax.tree.map(lambda m: m.reshape(count, *m.shape[2:]), metrics)


def draw_ahead_steps(count: int, period: int, fit: int) -> int:
    """How many of `count` steps `scan_sampled_updates` draws at once: the most that divide
    `count` and fit (`fit` steps' batches), whole blocks of `period` when `period` divides
    `count` (a block needs its batches together), at least one step or block (none of none)."""
    if count == 0:
        return 0
    unit = period if period > 1 and count % period == 0 else 1
    blocks = count // unit
    best = 1
    for size in range(1, blocks + 1):
        if blocks % size == 0 and size * unit <= fit:
            best = size
    return best * unit


def _split_leading(xs: Any, size: int) -> Any:
    """Every leaf `[U, ...]` as `[U // size, size, ...]`."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // size, size, *x.shape[1:]), xs)


def actor_branch(
    actor_step: bool | None,
    due: Array,
    with_actor: Callable[..., Any],
    without_actor: Callable[..., Any],
    *operands: Any,
) -> tuple[Any, Array]:
    """`with_actor(*operands)` or `without_actor(*operands)`, and whether the actor stepped
    `[]` bool: as `actor_step` says when `scan_updates` fixed it at trace time, else (None) as
    `due` says, a traced bool of the step count, through a `lax.cond`."""
    if actor_step is None:
        return jax.lax.cond(due, with_actor, without_actor, *operands), due
    branch = with_actor if actor_step else without_actor
    return branch(*operands), jnp.asarray(actor_step)


def additive_noise(action: Array, noise: Array, scale: Array) -> Array:
    """`clip(action + scale * noise, -1, 1)`: Gaussian exploration of std `scale` around a
    deterministic action, given standard normal `noise`."""
    return jnp.clip(action + scale * noise, -1.0, 1.0)


def soft_update(target: Params, online: Params, tau: float) -> Params:
    """Polyak averaging: `tau * online + (1 - tau) * target`, leaf by leaf."""
    return jax.tree.map(lambda t, o: tau * o + (1.0 - tau) * t, target, online)


def _clipped_adam(learning_rate: Any, max_grad_norm: float | None) -> optax.GradientTransformation:
    if max_grad_norm is None:
        return optax.adam(learning_rate)
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate))


def adam(learning_rate: float, max_grad_norm: float | None) -> optax.GradientTransformation:
    """Adam, after global-norm gradient clipping when `max_grad_norm` is set. The learning
    rate lives in the optimizer state (`optax.inject_hyperparams`), a traced value that
    `with_learning_rate` replaces: PBT gives every member its own under one `vmap`."""
    return optax.inject_hyperparams(_clipped_adam, static_args=("max_grad_norm",))(
        learning_rate=learning_rate, max_grad_norm=max_grad_norm
    )


def with_learning_rate(opt_state: Any, learning_rate: Array) -> Any:
    """An `adam` state whose next steps use `learning_rate` (moments and count kept)."""
    hyperparams = {**opt_state.hyperparams, "learning_rate": jnp.asarray(learning_rate)}
    return opt_state._replace(hyperparams=hyperparams)


def apply_gradients(
    optimizer: optax.GradientTransformation, params: Params, opt_state: Any, grads: Params
) -> tuple[Params, Any]:
    """One optimizer step: the new params and optimizer state."""
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


@dataclasses.dataclass(frozen=True)
class ActorCritic:
    """What TD3 and SAC share. A subclass types `config` (which must have critic_hidden_sizes,
    critic_layer_norm, num_critics, actor_lr, critic_lr and max_grad_norm) and defines
    `actor_network`, `actor_state_from_params` and `update(state, batch, key)`."""

    config: Any
    obs_dim: int
    action_dim: int

    @property
    def actor_network(self) -> nn.Module:
        raise NotImplementedError

    @property
    def critic_network(self) -> TwinCritic:
        cfg = self.config
        return TwinCritic(cfg.critic_hidden_sizes, cfg.critic_layer_norm, cfg.num_critics)

    @property
    def actor_optimizer(self) -> optax.GradientTransformation:
        return adam(self.config.actor_lr, self.config.max_grad_norm)

    @property
    def critic_optimizer(self) -> optax.GradientTransformation:
        return adam(self.config.critic_lr, self.config.max_grad_norm)

    # ---- per-member hyperparameters (PBT) -------------------------------------------------------

    @property
    def hyperparameters(self) -> dict[str, float]:
        """What PBT may set per member: name -> this config's value. A subclass adds its own."""
        return {"actor_lr": self.config.actor_lr, "critic_lr": self.config.critic_lr}

    def with_hyperparameters(self, state: Any, values: Mapping[str, Array]) -> Any:
        """`state` (one agent's) training on with `values` (every `hyperparameters` name)."""
        actor = dataclasses.replace(
            state.actor, opt_state=with_learning_rate(state.actor.opt_state, values["actor_lr"])
        )
        critic_opt_state = with_learning_rate(state.critic.opt_state, values["critic_lr"])
        critic = dataclasses.replace(state.critic, opt_state=critic_opt_state)
        return dataclasses.replace(state, actor=actor, critic=critic)

    def exploration_scale_of(self, values: Mapping[str, Array]) -> Array:
        """The `explore` scale of an agent with hyperparameters `values`."""
        del values
        return jnp.asarray(self.exploration_scale, jnp.float32)

    @property
    def exploration_scale(self) -> float:
        raise NotImplementedError

    def init_actor_params(self, key: Array) -> Params:
        return self.actor_network.init(key, jnp.zeros((self.obs_dim,), jnp.float32))

    def actor_state_from_params(self, params: Params) -> Any:
        raise NotImplementedError

    def init_actor(self, key: Array) -> Any:
        return self.actor_state_from_params(self.init_actor_params(key))

    def init_critic_params(self, key: Array) -> Params:
        """Parameters of all critic heads, leaves `[num_critics, ...]`."""
        obs = jnp.zeros((self.obs_dim,), jnp.float32)
        action = jnp.zeros((self.action_dim,), jnp.float32)
        return self.critic_network.init(key, obs, action)

    def q_values(self, critic_params: Params, obs: Array, action: Array) -> Array:
        """Q estimates of every critic head, `[num_critics, ...]`."""
        return cast(Array, self.critic_network.apply(critic_params, obs, action))

    def critic_loss(
        self, critic_params: Params, target_q: Array, batch: Transition
    ) -> tuple[Array, Array]:
        """Sum over critic heads of the mean squared TD error; aux = mean Q."""
        q = self.q_values(critic_params, batch.obs, batch.action)  # [num_critics, B]
        loss = jnp.sum(jnp.mean(jnp.square(q - target_q[None]), axis=-1))
        return loss, jnp.mean(q)

    @property
    def actor_period(self) -> int:
        """Critic steps per actor step (`scan_updates`); 1: the actor steps every time."""
        return 1

    def update(
        self, state: Any, batch: Transition, key: Array, actor_step: bool | None = None
    ) -> tuple[Any, Metrics]:
        """One gradient step; `actor_step` as `scan_updates` passes it."""
        raise NotImplementedError

    def update_many(
        self,
        state: _State,
        buffer_state: ReplayState,
        buffer: ReplayBuffer,
        key: Array,
        num_updates: int,
        prepare: Callable[[Transition], Transition] | None = None,
        draw_ahead_bytes: int = DRAW_AHEAD_BYTES,
    ) -> tuple[_State, Metrics]:
        """`num_updates` (static) calls of `update`, each on a fresh batch from the buffer
        (passed through `prepare` first when given, e.g. to normalize its observations),
        drawn ahead `draw_ahead_bytes` at most at a time.

        Runs as one `lax.scan`, the batches drawn ahead (`scan_sampled_updates`); returns the
        final state and the metrics averaged over the steps.
        """

        def draw(step_key):
            sample_key, _ = jax.random.split(step_key)
            batch = buffer.sample(buffer_state, sample_key)
            return batch if prepare is None else prepare(batch)

        def body(state, step_key, batch, actor_step):
            _, update_key = jax.random.split(step_key)
            return self.update(state, batch, update_key, actor_step)

        keys = jax.random.split(key, num_updates)
        state, metrics = scan_sampled_updates(
            body, state, keys, self.actor_period, draw, draw_ahead_bytes
        )
        return state, jax.tree.map(lambda x: jnp.mean(x, axis=0), metrics)
