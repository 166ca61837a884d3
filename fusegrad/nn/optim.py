"""Optimizers (docs/api.md, Optimizers): each step is a set of lazy assigns realized in one schedule.

Where an update runs: by default next to its parameter (same device, or the same devices and sharded axis), with its
state placed like the parameter. An explicit `device=` (or `fused=True`) runs every update on that device and keeps the
state there, e.g. parameters on an accelerator with state offloaded to "CPU": the weights and gradients are copied
to it, and each new value is copied (or sharded) back into its parameter."""

from __future__ import annotations
from typing import Sequence
from fusegrad.dtype import dtypes, to_dtype
from fusegrad.helpers import CONST_LR, FUSE_OPTIM, OPTIM_DTYPE, TRAINING
from fusegrad.runtime.buffers import canonical_device
from fusegrad.nn.placement import placed_like
from fusegrad.tensor import Tensor


class Optimizer:
    """Base class: keeps params (is_param) and buffers apart, holds lr as a tensor so schedules never recompile."""

    def __init__(self, params: Sequence[Tensor], lr: float, device: str | None = None, fused: bool | None = None):
        if lr < 0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        params = list(dict.fromkeys(params))
        for t in params:
            if t.requires_grad is None:
                t.requires_grad = True  # [compat] None becomes True when handed to an optimizer
        self.params = [t for t in params if t.is_param]
        self.buffers = [t for t in params if not t.is_param]
        assert self.params, "optimizer needs at least one parameter (a Tensor with is_param=True)"
        self.device = canonical_device(device) if device is not None else self.params[0].device
        self.offload = device is not None  # state and updates on self.device, not next to each parameter
        self.fused = bool(FUSE_OPTIM) if fused is None else fused
        if self.fused and self.per_tensor:
            raise ValueError(f"{type(self).__name__} scales each tensor on its own: fused=True is not supported")
        self.state_dtype = to_dtype(OPTIM_DTYPE.value)
        # a slot is what one update rule sees: one parameter, or (fused) all of them as one flat vector
        self.slot_shapes = [(sum(t.numel() for t in self.params),)] if self.fused else [t.shape for t in self.params]
        self.lr = (
            Tensor(lr, device=self.device, dtype=dtypes.float32)
            if CONST_LR
            else Tensor([lr], device=self.device, dtype=dtypes.float32).contiguous().realize().reshape(())
        )

    per_tensor = False  # True for rules that need each tensor's own norms (no fused flat update)

    def zero_grad(self) -> None:
        for t in self.params:
            t.grad = None

    def _home(self, t: Tensor) -> str | tuple[str, ...]:
        """Where the update of parameter t runs and its state lives."""
        return self.device if self.fused or self.offload else t.device

    def _states(self) -> list[Tensor]:
        """One zero state tensor per slot, placed where the slot's update runs."""
        if self.fused:
            zeros = [Tensor.zeros(self.slot_shapes[0], dtype=self.state_dtype, device=self.device)]
        else:
            zeros = [
                t.zeros_like(dtype=self.state_dtype)
                if self._home(t) == t.device
                else Tensor.zeros(t.shape, dtype=self.state_dtype, device=self.device)
                for t in self.params
            ]
        return [z.contiguous().realize() for z in zeros]

    def _local(self, x: Tensor, w: Tensor) -> Tensor:
        """An optimizer-wide tensor (lr, step counters) on the device(s) of slot value w."""
        return x if x.device == w.device else x.to(w.device)

    def step(self) -> None:
        # the gradients are realized with the update, which reads them: `.grad` then holds its value after the step
        # (not a graph of the old weights, which would make each weight's assign copy on write), and a gradient that
        # is a matmul runs as one rather than fused into an elementwise update
        Tensor.realize(*self.schedule_step(), *[t.grad for t in self.params if t.grad is not None])

    def schedule_step(self) -> list[Tensor]:
        """The tensors whose realization performs one step (for a custom realize or a JIT)."""
        if not TRAINING and not Tensor.training:
            raise RuntimeError(
                "Optimizer.step() needs training mode: use `with Context(TRAINING=1):` (or Tensor.training = True)"
            )
        for i, t in enumerate(self.params):
            if t.grad is None:
                raise RuntimeError(f"parameter {i} (shape {t.shape}) has no .grad; call backward() before step()")
        return self._updates() + self.buffers

    def _updates(self) -> list[Tensor]:
        """Runs the update rule on every slot and writes the new values back into the parameters."""

        def at_home(x: Tensor | None, t: Tensor) -> Tensor:
            assert x is not None  # schedule_step checked that every parameter has a gradient
            x = x if x.device == (home := self._home(t)) else x.to(home)
            return (x.flatten() if self.fused else x).cast(self.state_dtype)

        if not self.fused:
            slots = [(at_home(t.detach(), t), at_home(t.grad, t)) for t in self.params]
        else:
            flat = [(at_home(t.detach(), t), at_home(t.grad, t)) for t in self.params]
            slots = [(Tensor.cat(*(w for w, _ in flat)), Tensor.cat(*(g for _, g in flat)))]
        new_values = [self._update_slot(i, w, g) for i, (w, g) in enumerate(slots)]
        if not self.fused:
            return [self._apply(t, v) for t, v in zip(self.params, new_values)] + self._extra_updates()
        out, offset = [], 0
        for t in self.params:
            out.append(self._apply(t, new_values[0][offset : offset + t.numel()].reshape(t.shape)))
            offset += t.numel()
        return out + self._extra_updates()

    def _update_slot(self, i: int, w: Tensor, g: Tensor) -> Tensor:
        """The new value of slot i from its value w and gradient g (state assigns happen here too)."""
        raise NotImplementedError

    def _extra_updates(self) -> list[Tensor]:
        """State tensors assigned during a step, realized with it."""
        return []

    def _apply(self, t: Tensor, new_value: Tensor) -> Tensor:
        return t.assign(placed_like(new_value.cast(t.dtype), t))


class SGD(Optimizer):
    """SGD with weight decay added to the gradient, momentum `b = momentum*b + g`, optional nesterov; `classic`
    scales by lr before the momentum accumulation."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        classic: bool = False,
        device: str | None = None,
        fused: bool | None = None,
    ):
        super().__init__(params, lr, device, fused)
        self.momentum, self.weight_decay, self.nesterov, self.classic = momentum, weight_decay, nesterov, classic
        self.b = self._states() if momentum else []

    def _extra_updates(self) -> list[Tensor]:
        return self.b

    def _direction(self, i: int, g: Tensor) -> Tensor:
        """The step to subtract, already scaled by lr."""
        lr = self._local(self.lr, g)
        if self.classic:
            g = g * lr
        if self.momentum:
            b = self.b[i]
            new_b = b * self.momentum + g
            self._apply(b, new_b)
            g = g + new_b * self.momentum if self.nesterov else new_b
        return g if self.classic else g * lr

    def _update_slot(self, i: int, w: Tensor, g: Tensor) -> Tensor:
        # like torch, no decay term at all when it is 0 (two ops per parameter, and inf * 0 would make NaN)
        return w - self._direction(i, g + w * self.weight_decay if self.weight_decay else g)


class LARS(SGD):
    """SGD whose gradient is scaled per tensor by the trust ratio tcoef*|w| / (|g| + wd*|w|) (1 when a norm is 0)."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        ns_steps: int = 0,
        ns_coefficients: tuple | None = None,
        nesterov: bool = False,
        classic: bool = True,
        pre_wd: bool = True,
        tcoef: float = 0.001,
        device: str | None = None,
        fused: bool | None = None,
    ):
        super().__init__(params, lr, momentum, 0.0, nesterov, classic, device, fused)
        self.lars_wd, self.pre_wd, self.tcoef = weight_decay, pre_wd, tcoef

    per_tensor = True

    def _update_slot(self, i: int, w: Tensor, g: Tensor) -> Tensor:
        w_norm, g_norm = (w * w).sum().sqrt(), (g * g).sum().sqrt()
        ratio = ((w_norm > 0) & (g_norm > 0)).where(self.tcoef * w_norm / (g_norm + self.lars_wd * w_norm), 1.0)
        g = (g + w * self.lars_wd) * ratio if self.pre_wd else g * ratio + w * self.lars_wd
        return w - self._direction(i, g)


class Muon(SGD):
    """Momentum SGD whose update of each matrix is orthogonalized with newton_schulz; decoupled weight decay."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        momentum: float = 0.95,
        weight_decay: float = 0.1,
        ns_steps: int = 5,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
        nesterov: bool = True,
        device: str | None = None,
        fused: bool | None = None,
    ):
        super().__init__(params, lr, momentum, 0.0, nesterov, False, device, fused)
        self.muon_wd, self.ns_steps, self.ns_coefficients = weight_decay, ns_steps, ns_coefficients

    per_tensor = True

    def _update_slot(self, i: int, w: Tensor, g: Tensor) -> Tensor:
        new_b = self.b[i] * self.momentum + g
        self._apply(self.b[i], new_b)
        update = g + new_b * self.momentum if self.nesterov else new_b
        if w.ndim >= 2:  # vectors (biases, norms) take the plain momentum step
            flat = update.reshape(w.shape[0], -1)
            update = flat.newton_schulz(self.ns_steps, self.ns_coefficients).reshape(w.shape)
        lr = self._local(self.lr, w)
        return w * (1.0 - lr * self.muon_wd) - update * lr


class LAMB(Optimizer):
    """Adam-style moments; the update (plus weight decay) is scaled per tensor by |w| / |update| unless adam=True."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
        device: str | None = None,
        fused: bool | None = None,
    ):
        self.per_tensor = not adam  # the trust ratio needs each tensor's norms
        super().__init__(params, lr, device, fused)
        self.b1, self.b2, self.eps, self.weight_decay, self.adam = b1, b2, eps, weight_decay, adam
        # b**t kept in float64: 1 - 0.999**t in float32 would be off by ~5e-5 relative (torch uses Python doubles)
        self.b1_t = Tensor([1.0], dtype=dtypes.float64, device=self.device).contiguous().realize()
        self.b2_t = Tensor([1.0], dtype=dtypes.float64, device=self.device).contiguous().realize()
        self.m, self.v = self._states(), self._states()
        self._scalars: dict = {}

    def _updates(self) -> list[Tensor]:
        self._scalars = {}  # this step's bias corrections, per device: made once, not once per parameter
        updates = super()._updates()
        # held past the step they would read b**t's old value after its assign, which then copies on write
        self._scalars = {}
        return updates

    def _step_scalars(self, w: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """This step's 0-d scalars on w's device, in the state dtype: (1 - b1**t, 1 - b2**t, 1 - lr * weight_decay)
        for LAMB, (lr / (1 - b1**t), sqrt(1 - b2**t), 1 - lr * weight_decay) for Adam, the decay None without one."""
        if (scalars := self._scalars.get(w.device)) is None:
            c1 = 1.0 - self._local(self.b1_t, w) * self.b1  # float64: b**t for the step being made
            c2 = 1.0 - self._local(self.b2_t, w) * self.b2
            lr = self._local(self.lr, w)
            if self.adam:  # torch's form: the step size and the square root of the second correction, once a step
                c1, c2 = lr.cast(dtypes.float64) / c1.reshape(()), c2.sqrt()
            decay = 1.0 - lr * self.weight_decay if self.adam and self.weight_decay else None
            scalars = self._scalars[w.device] = (
                c1.reshape(()).cast(self.state_dtype),
                c2.reshape(()).cast(self.state_dtype),
                None if decay is None else decay.cast(self.state_dtype),
            )
        return scalars

    def _update_slot(self, i: int, w: Tensor, g: Tensor) -> Tensor:
        new_m = self.m[i] * self.b1 + g * (1.0 - self.b1)
        new_v = self.v[i] * self.b2 + (g * g) * (1.0 - self.b2)
        self._apply(self.m[i], new_m)
        self._apply(self.v[i], new_v)
        c1, c2, decay = self._step_scalars(w)
        if self.adam:
            # w (1 - lr wd) - step_size m / (sqrt(v) / sqrt(1 - b2**t) + eps), as torch's Adam and AdamW compute it
            step = new_m / (new_v.sqrt() / c2 + self.eps) * c1
            return (w if decay is None else w * decay) - step
        up = (new_m / c1) / ((new_v / c2).sqrt() + self.eps) + w * self.weight_decay
        r1, r2 = (w * w).sum().sqrt(), (up * up).sum().sqrt()
        up = up * ((r1 > 0) & (r2 > 0)).where(r1 / r2, 1.0)
        return w - up * self._local(self.lr, w)

    def _extra_updates(self) -> list[Tensor]:
        return self.m + self.v + [self.b1_t.assign(self.b1_t * self.b1), self.b2_t.assign(self.b2_t * self.b2)]


def Adam(
    params: Sequence[Tensor],
    lr: float = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    device: str | None = None,
    fused: bool | None = None,
) -> LAMB:
    """Adam with bias correction (LAMB without the trust ratio)."""
    return LAMB(params, lr, b1, b2, eps, 0.0, adam=True, device=device, fused=fused)


def AdamW(
    params: Sequence[Tensor],
    lr: float = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    device: str | None = None,
    fused: bool | None = None,
) -> LAMB:
    """Adam with decoupled weight decay: wd*w joins the update before it is multiplied by lr."""
    return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, device=device, fused=fused)


class OptimizerGroup(Optimizer):
    """Several optimizers stepped together (one schedule)."""

    def __init__(self, *optimizers: Optimizer):
        self.optimizers = list(optimizers)
        self.params = [p for o in self.optimizers for p in o.params]
        self.buffers = [b for o in self.optimizers for b in o.buffers]

    def __getitem__(self, i: int) -> Optimizer:
        return self.optimizers[i]

    per_tensor = False  # True for rules that need each tensor's own norms (no fused flat update)

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def schedule_step(self) -> list[Tensor]:
        return [t for o in self.optimizers for t in o.schedule_step()]


__all__ = ["Optimizer", "SGD", "LARS", "Muon", "LAMB", "Adam", "AdamW", "OptimizerGroup"]
