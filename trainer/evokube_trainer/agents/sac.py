"""SAC: Soft Actor-Critic with automatic entropy tuning (Haarnoja et al., 2018, "Soft
Actor-Critic Algorithms and Applications").

Design
------
As `TD3`: `SAC(config, obs_dim, action_dim)` is a frozen dataclass holding only static
structure; all learning state is a `SACState` pytree passed in and out, so every method is a
pure function that callers may `jit`, `lax.scan` or `vmap`. The state has two halves:

* `SACActorState` (params, opt_state) -- the Gaussian actor (`GaussianActor`: a trunk with a
  mean head and a log-std head) and its Adam state. SAC keeps no actor target.
* `SoftCriticState` (params, target_params, opt_state, log_alpha, alpha_opt_state) -- the twin
  Q networks (leaves `[num_critics, ...]`) and the entropy temperature alpha they are trained
  with: the soft Q function is defined for one alpha, so the temperature lives on the critic
  side (in CEM-RL, K actors share both).

The actor samples `a = tanh(u)`, `u = mean + std * eps`, `eps ~ N(0, 1)` (reparameterized), with
`log pi(a|s) = log N(u; mean, std) - sum log(1 - tanh(u)^2)`. The pieces of one step:

* `critic_update(critic, actor_params, batch, key)`: one gradient step towards the soft target
  `y = r + discount * (1 - terminated) * (min_i Q'_i(s', a') - alpha * log pi(a'|s'))`,
  `a' ~ pi(.|s')` from the CURRENT actor (SAC has no target policy).
* `actor_update(actor, critic, batch, key)`: one step on `E[alpha * log pi(a|s) - min_i
  Q_i(s, a)]`; also returns the log-probabilities of its samples.
* `temperature_update(critic, log_probs)`: one step on `-log_alpha * (log pi + target_entropy)`
  (`target_entropy` defaults to `-action_dim`): alpha grows while the policy's entropy is below
  the target and shrinks while above it.
* `update_target(critic)`: Polyak averaging of the critic target.

`update(state, batch, key)` runs them in that order every call (the paper's schedule: one
critic, actor, temperature and target step per gradient step); `update_many` scans it over
fresh replay batches. `shared_update` is the CEM-RL step: one critic step on the mean of K
actors' soft TD losses (actor k's samples build the targets of batch k), then each actor steps
against the shared critic and the temperature on all K actors' log-probabilities.

EC side: a population member is one `GaussianActor`'s flattened parameters, both heads
included; the deterministic, deployable policy is `tanh(mean)` (`policy`), and an RL actor
explores by sampling from itself (`explore` with scale 1). Transitions follow
`replay.Transition` as for TD3 (`terminated` stops bootstrapping, `truncated` does not); actions
are in [-1, 1].
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax
from flax import struct

from evokube_trainer.agents.base import ActorCritic, apply_gradients, soft_update
from evokube_trainer.agents.networks import GaussianActor, deterministic_policy
from evokube_trainer.replay import Transition

__all__ = ["SAC", "SACActorState", "SACConfig", "SACState", "SoftCriticState"]

Array = jax.Array
Params = Any
Metrics = dict[str, Array]


@dataclasses.dataclass(frozen=True)
class SACConfig:
    """SAC hyperparameters; defaults follow the paper (Haarnoja et al. 2018, "Soft Actor-Critic
    Algorithms and Applications", Table 1), as do EvoRL's and CleanRL's SAC."""

    actor_hidden_sizes: tuple[int, ...] = (256, 256)
    critic_hidden_sizes: tuple[int, ...] = (256, 256)
    critic_layer_norm: bool = False  # LayerNorm after each hidden critic layer
    num_critics: int = 2  # targets and the actor loss take the min over all of them
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    temperature_lr: float = 3e-4  # Adam on log(alpha)
    max_grad_norm: float | None = None  # global-norm gradient clipping, off by default
    discount: float = 0.99
    tau: float = 0.005  # Polyak coefficient of the critic's soft target update
    init_temperature: float = 1.0  # alpha at the start (log alpha = 0)
    target_entropy: float | None = None  # None: -action_dim, the paper's heuristic
    tune_temperature: bool = True  # False: alpha stays at init_temperature

    def __post_init__(self):
        if self.num_critics < 1:
            raise ValueError("num_critics must be >= 1")
        if not self.init_temperature > 0:
            raise ValueError(f"init_temperature must be > 0, got {self.init_temperature}")


@struct.dataclass
class SACActorState:
    params: Params  # GaussianActor parameters (mean and log-std heads)
    opt_state: optax.OptState


@struct.dataclass
class SoftCriticState:
    params: Params  # twin critic parameters, leaves [num_critics, ...]
    target_params: Params  # slowly tracking copy used for the soft targets
    opt_state: optax.OptState
    log_alpha: Array  # [] log of the entropy temperature alpha
    alpha_opt_state: optax.OptState
    target_entropy: Array  # [] the entropy alpha steers toward (state, so PBT can vary it)


@struct.dataclass
class SACState:
    actor: SACActorState
    critic: SoftCriticState
    step: Array  # [] int32 gradient steps taken so far


def _squashed_sample(mean: Array, log_std: Array, noise: Array) -> tuple[Array, Array]:
    """`tanh(mean + std * noise)` `[..., act]` and its log-density `[...]` under the squashed
    Gaussian. log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|."""
    u = mean + jnp.exp(log_std) * noise
    gaussian = -0.5 * jnp.square(noise) - log_std - 0.5 * math.log(2.0 * math.pi)
    log_det = 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return jnp.tanh(u), jnp.sum(gaussian - log_det, axis=-1)


@dataclasses.dataclass(frozen=True)
class SAC(ActorCritic):
    """Static SAC logic; see the module docstring for how the pieces fit. Critic networks,
    optimizers, `q_values`, `critic_loss` and `update_many` come from `ActorCritic`."""

    config: SACConfig

    @property
    def actor_network(self) -> GaussianActor:
        return GaussianActor(self.action_dim, self.config.actor_hidden_sizes)

    @property
    def temperature_optimizer(self) -> optax.GradientTransformation:
        return optax.adam(self.config.temperature_lr)

    @property
    def target_entropy(self) -> float:
        target = self.config.target_entropy
        return -float(self.action_dim) if target is None else target

    @property
    def hyperparameters(self) -> dict[str, float]:
        """The learning rates and a scale of the target entropy (PBT's per-member values)."""
        return {**super().hyperparameters, "target_entropy_scale": 1.0}

    def with_hyperparameters(self, state: SACState, values: Mapping[str, Array]) -> SACState:
        state = super().with_hyperparameters(state, values)
        target_entropy = values["target_entropy_scale"] * self.target_entropy
        critic = dataclasses.replace(state.critic, target_entropy=target_entropy)
        return dataclasses.replace(state, critic=critic)

    # ---- init ---------------------------------------------------------------------------------

    def actor_state_from_params(self, params: Params) -> SACActorState:
        """Wraps given actor params (e.g. unflattened from EC) with a fresh Adam state."""
        return SACActorState(params=params, opt_state=self.actor_optimizer.init(params))

    def init_critic(self, key: Array) -> SoftCriticState:
        params = self.init_critic_params(key)
        log_alpha = jnp.asarray(math.log(self.config.init_temperature), jnp.float32)
        return SoftCriticState(
            params=params,
            target_params=params,
            opt_state=self.critic_optimizer.init(params),
            log_alpha=log_alpha,
            alpha_opt_state=self.temperature_optimizer.init(log_alpha),
            target_entropy=jnp.asarray(self.target_entropy, jnp.float32),
        )

    def init(self, key: Array) -> SACState:
        actor_key, critic_key = jax.random.split(key)
        return SACState(
            actor=self.init_actor(actor_key),
            critic=self.init_critic(critic_key),
            step=jnp.zeros((), jnp.int32),
        )

    # ---- acting -------------------------------------------------------------------------------

    def distribution(self, actor_params: Params, obs: Array) -> tuple[Array, Array]:
        """(mean, log_std) `[..., action_dim]` of the pre-tanh Gaussian."""
        return cast(tuple[Array, Array], self.actor_network.apply(actor_params, obs))

    def policy(self, actor_params: Params, obs: Array) -> Array:
        """Deterministic action `tanh(mean)` `[..., action_dim]` in [-1, 1]."""
        return deterministic_policy(self.actor_network, actor_params, obs)

    def sample(self, actor_params: Params, obs: Array, key: Array) -> tuple[Array, Array]:
        """A reparameterized action `[..., action_dim]` in (-1, 1) and its log pi `[...]`."""
        mean, log_std = self.distribution(actor_params, obs)
        return _squashed_sample(mean, log_std, jax.random.normal(key, mean.shape, mean.dtype))

    @property
    def exploration_scale(self) -> float:
        """The `explore` scale of an RL actor's rollouts: 1, a sample of the policy."""
        return 1.0

    def explore(self, actor_params: Params, obs: Array, noise: Array, scale: Array) -> Array:
        """`tanh(mean + scale * std * noise)`, noise ~ N(0, 1) `[..., action_dim]`: a sample of
        the policy with scale 1, the deterministic policy with scale 0."""
        mean, log_std = self.distribution(actor_params, obs)
        return jnp.tanh(mean + scale * jnp.exp(log_std) * noise)

    # ---- critic -------------------------------------------------------------------------------

    def critic_target(
        self, critic: SoftCriticState, actor_params: Params, batch: Transition, key: Array
    ) -> Array:
        """y = r + discount * (1 - terminated) * (min_i Q'_i(s', a') - alpha log pi(a'|s')),
        `[B]`, no gradient; a' ~ pi(.|s') of `actor_params`."""
        next_action, next_log_prob = self.sample(actor_params, batch.next_obs, key)
        next_q = jnp.min(self.q_values(critic.target_params, batch.next_obs, next_action), axis=0)
        soft_q = next_q - jnp.exp(critic.log_alpha) * next_log_prob
        not_done = 1.0 - batch.terminated.astype(jnp.float32)
        return jax.lax.stop_gradient(batch.reward + self.config.discount * not_done * soft_q)

    def _critic_step(
        self,
        critic: SoftCriticState,
        loss_fn: Callable[[Params], tuple[Array, Array]],
        target_q: Array,
    ) -> tuple[SoftCriticState, Metrics]:
        (loss, q_mean), grads = jax.value_and_grad(loss_fn, has_aux=True)(critic.params)
        params, opt_state = apply_gradients(
            self.critic_optimizer, critic.params, critic.opt_state, grads
        )
        metrics = {"critic_loss": loss, "q_mean": q_mean, "target_q_mean": jnp.mean(target_q)}
        return dataclasses.replace(critic, params=params, opt_state=opt_state), metrics

    def critic_update(
        self, critic: SoftCriticState, actor_params: Params, batch: Transition, key: Array
    ) -> tuple[SoftCriticState, Metrics]:
        """One gradient step of the critic; its target network is left untouched."""
        target_q = self.critic_target(critic, actor_params, batch, key)  # [B]
        return self._critic_step(
            critic, lambda params: self.critic_loss(params, target_q, batch), target_q
        )

    def shared_critic_update(
        self, critic: SoftCriticState, actor_params: Params, batches: Transition, key: Array
    ) -> tuple[SoftCriticState, Metrics]:
        """One critic step on the mean loss over K actors (CEM-RL): `actor_params` leaves
        `[K, ...]`, `batches` leaves `[K, B, ...]`; actor k's samples build batch k's targets."""
        num_actors = jax.tree.leaves(batches)[0].shape[0]
        keys = jax.random.split(key, num_actors)
        target_q = jax.vmap(self.critic_target, in_axes=(None, 0, 0, 0))(
            critic, actor_params, batches, keys
        )  # [K, B]

        def mean_loss(params):
            losses, q_means = jax.vmap(self.critic_loss, in_axes=(None, 0, 0))(
                params, target_q, batches
            )
            return jnp.mean(losses), jnp.mean(q_means)

        return self._critic_step(critic, mean_loss, target_q)

    # ---- actor and temperature ----------------------------------------------------------------

    def actor_loss(
        self, actor_params: Params, critic: SoftCriticState, obs: Array, key: Array
    ) -> tuple[Array, Array]:
        """mean(alpha log pi(a|s) - min_i Q_i(s, a)), a ~ pi(.|s); aux = log pi `[B]`."""
        action, log_prob = self.sample(actor_params, obs, key)
        q = jnp.min(self.q_values(critic.params, obs, action), axis=0)  # [B]
        alpha = jax.lax.stop_gradient(jnp.exp(critic.log_alpha))
        return jnp.mean(alpha * log_prob - q), log_prob

    def actor_update(
        self, actor: SACActorState, critic: SoftCriticState, batch: Transition, key: Array
    ) -> tuple[SACActorState, Array, Metrics]:
        """One step against `critic`; returns the log pi `[B]` of the samples it used."""
        (loss, log_prob), grads = jax.value_and_grad(self.actor_loss, has_aux=True)(
            actor.params, critic, batch.obs, key
        )
        params, opt_state = apply_gradients(
            self.actor_optimizer, actor.params, actor.opt_state, grads
        )
        metrics = {"actor_loss": loss, "entropy": -jnp.mean(log_prob)}
        return dataclasses.replace(actor, params=params, opt_state=opt_state), log_prob, metrics

    def temperature_loss(self, log_alpha: Array, log_prob: Array, target_entropy: Array) -> Array:
        """-log_alpha * mean(log pi + target_entropy); log_prob of any shape, no gradient."""
        gap = jax.lax.stop_gradient(jnp.mean(log_prob) + target_entropy)
        return -log_alpha * gap

    def temperature_update(
        self, critic: SoftCriticState, log_prob: Array
    ) -> tuple[SoftCriticState, Metrics]:
        """One Adam step on log(alpha) (none when `tune_temperature` is off)."""
        loss, grad = jax.value_and_grad(self.temperature_loss)(
            critic.log_alpha, log_prob, critic.target_entropy
        )
        if self.config.tune_temperature:
            log_alpha, opt_state = apply_gradients(
                self.temperature_optimizer, critic.log_alpha, critic.alpha_opt_state, grad
            )
            critic = dataclasses.replace(critic, log_alpha=log_alpha, alpha_opt_state=opt_state)
        return critic, {"alpha": jnp.exp(critic.log_alpha), "alpha_loss": loss}

    def update_target(self, critic: SoftCriticState) -> SoftCriticState:
        """Soft update of the critic target."""
        target_params = soft_update(critic.target_params, critic.params, self.config.tau)
        return dataclasses.replace(critic, target_params=target_params)

    # ---- full steps ---------------------------------------------------------------------------

    def update(
        self, state: SACState, batch: Transition, key: Array, actor_step: bool | None = None
    ) -> tuple[SACState, Metrics]:
        """One SAC gradient step on `batch` (leaves `[B, ...]`): critic, actor (against the new
        critic), temperature, critic target. `actor_step` is unused: the actor steps every time.

        Metrics: critic_loss, q_mean, target_q_mean, actor_loss, entropy (-mean log pi of the
        actor step's samples), alpha (after the step), alpha_loss.
        """
        del actor_step
        critic_key, actor_key = jax.random.split(key)
        critic, metrics = self.critic_update(state.critic, state.actor.params, batch, critic_key)
        actor, log_prob, actor_metrics = self.actor_update(state.actor, critic, batch, actor_key)
        critic, temperature_metrics = self.temperature_update(critic, log_prob)
        critic = self.update_target(critic)
        metrics = {**metrics, **actor_metrics, **temperature_metrics}
        return SACState(actor=actor, critic=critic, step=state.step + 1), metrics

    def shared_update(
        self,
        critic: SoftCriticState,
        actors: SACActorState,
        step: Array,
        batches: Transition,
        key: Array,
        actor_step: bool | None = None,
    ) -> tuple[SoftCriticState, SACActorState, Metrics]:
        """One CEM-RL step: K actors (leaves `[K, ...]`) and one critic, batch k for actor k.

        The critic steps on the mean of the K soft TD losses, each actor against the new
        critic, the temperature on all K actors' log-probabilities (one alpha: one soft Q
        function), then the critic target. `step` is unused: SAC updates the actors every step.
        Metrics as `update`'s, actor_loss and entropy averaged over actors, actor_updated 1.
        """
        del step, actor_step
        num_actors = jax.tree.leaves(batches)[0].shape[0]
        critic_key, actor_key = jax.random.split(key)
        critic, metrics = self.shared_critic_update(critic, actors.params, batches, critic_key)
        actors, log_prob, actor_metrics = jax.vmap(self.actor_update, in_axes=(0, None, 0, 0))(
            actors, critic, batches, jax.random.split(actor_key, num_actors)
        )  # log_prob [K, B]
        critic, temperature_metrics = self.temperature_update(critic, log_prob)
        critic = self.update_target(critic)
        metrics = {
            **metrics,
            **jax.tree.map(jnp.mean, actor_metrics),
            **temperature_metrics,
            "actor_updated": jnp.ones((), jnp.float32),
        }
        return critic, actors, metrics
