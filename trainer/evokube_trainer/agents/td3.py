"""TD3: Twin Delayed Deep Deterministic policy gradient (Fujimoto, van Hoof and Meger, 2018).

Design
------
`TD3(config, obs_dim, action_dim)` is a frozen dataclass that holds only static structure; all
learning state is a `TD3State` pytree passed in and out, so every method is a pure function that
callers may `jit`, `lax.scan` or `vmap`. The state is split in two independent halves:

* `ActorState`  (params, target_params, opt_state) -- one policy and its Adam state.
* `CriticState` (params, target_params, opt_state) -- the twin Q networks, stacked along a
  leading `[num_critics]` axis inside the params.

and the learning step is split the same way, so ERL workflows can recombine the pieces:

* `critic_update(critic, target_actor_params, batch, key)`: one gradient step of the clipped
  double-Q loss. The target actions come from whichever actor target the caller passes.
* `actor_update(actor, critic_params, batch)`: one deterministic policy-gradient step against a
  given critic.
* `update_target(actor_or_critic)`: Polyak averaging `target <- tau * online + (1 - tau) * target`.

`update(state, batch, key)` composes them into the standard TD3 step: a critic step every call;
every `actor_update_interval` calls also an actor step followed by the soft update of BOTH targets
(as in the authors' implementation). `update_many` scans `update` over freshly sampled replay
batches.

How the ERL algorithms use it:

* K independent agents (ERL-GA style): stack K `TD3State`s (`jax.vmap(td3.init)(keys)`) and
  `jax.vmap(td3.update)(states, batches, keys)`; the delay branch becomes a select under vmap.
* K actors sharing one critic (CEM-RL): `shared_update(critic, actors[K], step, batches[K, B],
  key)` is the same step for K actors: `shared_critic_update` takes one gradient step on the
  mean of the K per-actor critic losses; every `actor_update_interval` steps each actor then
  takes a policy-gradient step against the shared critic (`jax.vmap(td3.actor_update, ...)`)
  and all targets are soft-updated. Actors coming from the EC side are wrapped with
  `actor_state_from_params` (fresh target and optimizer state).

TD3 is an `agents.base.Agent`; it explores with additive Gaussian noise of std
`exploration_noise` on the deterministic policy (`explore`).

Transitions follow `replay.Transition`: `terminated` stops bootstrapping (discount multiplied by
`1 - terminated`), `truncated` does not (a time limit is not a true end of the MDP). Actions are
in [-1, 1]; the env adapter maps them to the env's bounds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import jax
import jax.numpy as jnp
import optax
from flax import struct

from evokube_trainer.agents.base import (
    ActorCritic,
    actor_branch,
    additive_noise,
    apply_gradients,
    soft_update,
)
from evokube_trainer.agents.networks import Actor, deterministic_policy
from evokube_trainer.replay import Transition

__all__ = [
    "TD3",
    "ActorState",
    "CriticState",
    "TD3Config",
    "TD3State",
]

Array = jax.Array
Params = Any


@dataclasses.dataclass(frozen=True)
class TD3Config:
    """TD3 hyperparameters; defaults follow the paper and the authors' reference code."""

    actor_hidden_sizes: tuple[int, ...] = (256, 256)
    critic_hidden_sizes: tuple[int, ...] = (256, 256)
    critic_layer_norm: bool = False  # LayerNorm after each hidden critic layer
    num_critics: int = 2  # the target takes the min over all of them
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    max_grad_norm: float | None = None  # global-norm gradient clipping, off by default
    discount: float = 0.99
    tau: float = 0.005  # Polyak coefficient of the soft target update
    policy_noise: float = 0.2  # std of the target policy smoothing noise
    noise_clip: float = 0.5  # the smoothing noise is clipped to [-noise_clip, noise_clip]
    actor_update_interval: int = 2  # critic steps per actor (and target) step
    exploration_noise: float = 0.1  # std of the Gaussian noise on ERL's RL actors' rollouts
    actor_loss_q: Literal["first", "min"] = "first"  # which Q the actor maximizes

    def __post_init__(self):
        if self.actor_update_interval < 1:
            raise ValueError("actor_update_interval must be >= 1")
        if self.num_critics < 1:
            raise ValueError("num_critics must be >= 1")
        if self.actor_loss_q not in ("first", "min"):
            raise ValueError(f"actor_loss_q must be 'first' or 'min', got {self.actor_loss_q!r}")


@struct.dataclass
class ActorState:
    params: Params  # actor network parameters
    target_params: Params  # slowly tracking copy used for critic targets
    opt_state: optax.OptState


@struct.dataclass
class CriticState:
    params: Params  # twin critic parameters, leaves [num_critics, ...]
    target_params: Params
    opt_state: optax.OptState


@struct.dataclass
class TD3State:
    actor: ActorState
    critic: CriticState
    step: Array  # [] int32, critic gradient steps taken so far


_NetState = TypeVar("_NetState", ActorState, CriticState)


@dataclasses.dataclass(frozen=True)
class TD3(ActorCritic):
    """Static TD3 logic; see the module docstring for how the pieces fit. Critic networks,
    optimizers, `q_values`, `critic_loss` and `update_many` come from `ActorCritic`."""

    config: TD3Config

    @property
    def actor_network(self) -> Actor:
        return Actor(self.action_dim, self.config.actor_hidden_sizes)

    # ---- init ---------------------------------------------------------------------------------

    def actor_state_from_params(self, params: Params) -> ActorState:
        """Wraps given actor params (e.g. unflattened from EC) with a target and Adam state."""
        return ActorState(
            params=params,
            target_params=params,
            opt_state=self.actor_optimizer.init(params),
        )

    def init_critic(self, key: Array) -> CriticState:
        params = self.init_critic_params(key)
        return CriticState(
            params=params,
            target_params=params,
            opt_state=self.critic_optimizer.init(params),
        )

    def init(self, key: Array) -> TD3State:
        actor_key, critic_key = jax.random.split(key)
        return TD3State(
            actor=self.init_actor(actor_key),
            critic=self.init_critic(critic_key),
            step=jnp.zeros((), jnp.int32),
        )

    # ---- acting -------------------------------------------------------------------------------

    def policy(self, actor_params: Params, obs: Array) -> Array:
        """Deterministic action `[..., action_dim]` in [-1, 1]."""
        return deterministic_policy(self.actor_network, actor_params, obs)

    @property
    def exploration_scale(self) -> float:
        """The `explore` scale of an RL actor's rollouts: the std of its action noise."""
        return self.config.exploration_noise

    @property
    def hyperparameters(self) -> dict[str, float]:
        """The learning rates and the exploration noise (PBT's per-member values)."""
        return {**super().hyperparameters, "exploration_noise": self.config.exploration_noise}

    def exploration_scale_of(self, values: Mapping[str, Array]) -> Array:
        return values["exploration_noise"]

    def explore(self, actor_params: Params, obs: Array, noise: Array, scale: Array) -> Array:
        """`clip(policy + scale * noise, -1, 1)`; noise ~ N(0, 1) `[..., action_dim]`."""
        return additive_noise(self.policy(actor_params, obs), noise, scale)

    # ---- critic -------------------------------------------------------------------------------

    def target_action(self, target_actor_params: Params, next_obs: Array, key: Array) -> Array:
        """Smoothed target action pi'(s') + clip(N(0, policy_noise^2), +-noise_clip), in [-1, 1]."""
        cfg = self.config
        action = self.policy(target_actor_params, next_obs)
        noise = cfg.policy_noise * jax.random.normal(key, action.shape, action.dtype)
        noise = jnp.clip(noise, -cfg.noise_clip, cfg.noise_clip)
        return jnp.clip(action + noise, -1.0, 1.0)

    def critic_target(
        self,
        target_critic_params: Params,
        target_actor_params: Params,
        batch: Transition,
        key: Array,
    ) -> Array:
        """y = r + discount * (1 - terminated) * min_i Q'_i(s', a~'), `[B]`, no gradient."""
        next_action = self.target_action(target_actor_params, batch.next_obs, key)
        next_q = jnp.min(self.q_values(target_critic_params, batch.next_obs, next_action), axis=0)
        not_done = 1.0 - batch.terminated.astype(jnp.float32)
        target = batch.reward + self.config.discount * not_done * next_q
        return jax.lax.stop_gradient(target)

    def _apply_critic_grads(self, critic: CriticState, grads: Params) -> CriticState:
        params, opt_state = apply_gradients(
            self.critic_optimizer, critic.params, critic.opt_state, grads
        )
        return dataclasses.replace(critic, params=params, opt_state=opt_state)

    def critic_update(
        self,
        critic: CriticState,
        target_actor_params: Params,
        batch: Transition,
        key: Array,
    ) -> tuple[CriticState, dict[str, Array]]:
        """One gradient step of the critic; its target network is left untouched."""
        target_q = self.critic_target(critic.target_params, target_actor_params, batch, key)
        (loss, q_mean), grads = jax.value_and_grad(self.critic_loss, has_aux=True)(
            critic.params, target_q, batch
        )
        metrics = {"critic_loss": loss, "q_mean": q_mean, "target_q_mean": jnp.mean(target_q)}
        return self._apply_critic_grads(critic, grads), metrics

    def shared_critic_update(
        self,
        critic: CriticState,
        target_actor_params: Params,
        batches: Transition,
        key: Array,
    ) -> tuple[CriticState, dict[str, Array]]:
        """One critic step on the mean loss over K actors (CEM-RL).

        `target_actor_params` has leaves `[K, ...]`, `batches` leaves `[K, B, ...]`: actor k's
        target policy builds the targets for batch k.
        """
        num_actors = jax.tree.leaves(batches)[0].shape[0]
        keys = jax.random.split(key, num_actors)
        target_q = jax.vmap(self.critic_target, in_axes=(None, 0, 0, 0))(
            critic.target_params, target_actor_params, batches, keys
        )  # [K, B]

        def mean_loss(params):
            losses, q_means = jax.vmap(self.critic_loss, in_axes=(None, 0, 0))(
                params, target_q, batches
            )
            return jnp.mean(losses), jnp.mean(q_means)

        (loss, q_mean), grads = jax.value_and_grad(mean_loss, has_aux=True)(critic.params)
        metrics = {"critic_loss": loss, "q_mean": q_mean, "target_q_mean": jnp.mean(target_q)}
        return self._apply_critic_grads(critic, grads), metrics

    # ---- actor --------------------------------------------------------------------------------

    def actor_loss(self, actor_params: Params, critic_params: Params, obs: Array) -> Array:
        """-mean Q(s, pi(s)) with the first critic head, or the min over heads."""
        q = self.q_values(critic_params, obs, self.policy(actor_params, obs))  # [num_critics, B]
        q = q[0] if self.config.actor_loss_q == "first" else jnp.min(q, axis=0)
        return -jnp.mean(q)

    def actor_update(
        self, actor: ActorState, critic_params: Params, batch: Transition
    ) -> tuple[ActorState, dict[str, Array]]:
        """One policy-gradient step against `critic_params`; the actor target is untouched."""
        loss, grads = jax.value_and_grad(self.actor_loss)(actor.params, critic_params, batch.obs)
        params, opt_state = apply_gradients(
            self.actor_optimizer, actor.params, actor.opt_state, grads
        )
        actor = dataclasses.replace(actor, params=params, opt_state=opt_state)
        return actor, {"actor_loss": loss}

    # ---- targets and the full step ------------------------------------------------------------

    def update_target(self, state: _NetState) -> _NetState:
        """Soft update of the target network held in an `ActorState` or `CriticState`."""
        target_params = soft_update(state.target_params, state.params, self.config.tau)
        return dataclasses.replace(state, target_params=target_params)

    @property
    def actor_period(self) -> int:
        return self.config.actor_update_interval

    def update(
        self, state: TD3State, batch: Transition, key: Array, actor_step: bool | None = None
    ) -> tuple[TD3State, dict[str, Array]]:
        """One TD3 gradient step on `batch` (leaves `[B, ...]`); the actor steps when
        `actor_step`, or, None, every `actor_update_interval` steps of the step count.

        Metrics: critic_loss, q_mean, target_q_mean, actor_loss (the current actor loss, also
        reported on steps without an actor update) and actor_updated (0/1).
        """
        critic, metrics = self.critic_update(state.critic, state.actor.target_params, batch, key)
        step = state.step + 1

        def with_actor(actor, critic):
            actor, actor_metrics = self.actor_update(actor, critic.params, batch)
            return (
                self.update_target(actor),
                self.update_target(critic),
                actor_metrics["actor_loss"],
            )

        def without_actor(actor, critic):
            return actor, critic, self.actor_loss(actor.params, critic.params, batch.obs)

        due = step % self.config.actor_update_interval == 0
        (actor, critic, actor_loss), do_actor = actor_branch(
            actor_step, due, with_actor, without_actor, state.actor, critic
        )
        metrics = {
            **metrics,
            "actor_loss": actor_loss,
            "actor_updated": do_actor.astype(jnp.float32),
        }
        return TD3State(actor=actor, critic=critic, step=step), metrics

    def shared_update(
        self,
        critic: CriticState,
        actors: ActorState,
        step: Array,
        batches: Transition,
        key: Array,
        actor_step: bool | None = None,
    ) -> tuple[CriticState, ActorState, dict[str, Array]]:
        """One CEM-RL step: K actors (leaves `[K, ...]`) and one critic, batch k for actor k.

        `step` counts the critic steps taken before this one. The critic steps on the mean of
        the K per-actor losses; when `actor_step` (None: every `actor_update_interval` steps of
        `step`) each actor also takes a policy-gradient step against the new critic, then
        every target is soft-updated. Metrics as `update`'s; actor_loss is the mean over
        actors, 0 when they did not step.
        """
        critic, metrics = self.shared_critic_update(critic, actors.target_params, batches, key)

        def with_actors(critic, actors):
            actors, actor_metrics = jax.vmap(self.actor_update, in_axes=(0, None, 0))(
                actors, critic.params, batches
            )
            actors = jax.vmap(self.update_target)(actors)
            return self.update_target(critic), actors, jnp.mean(actor_metrics["actor_loss"])

        def without_actors(critic, actors):
            return critic, actors, jnp.zeros((), jnp.float32)

        due = (step + 1) % self.config.actor_update_interval == 0
        (critic, actors, actor_loss), do_actors = actor_branch(
            actor_step, due, with_actors, without_actors, critic, actors
        )
        metrics = {
            **metrics,
            "actor_loss": actor_loss,
            "actor_updated": do_actors.astype(jnp.float32),
        }
        return critic, actors, metrics
