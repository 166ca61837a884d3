"""Optimizers (API.md §7.2): each step is a set of lazy assigns realized in one schedule."""

from __future__ import annotations
from typing import Sequence
from fusegrad.dtype import dtypes, to_dtype
from fusegrad.helpers import CONST_LR, FUSE_OPTIM, OPTIM_DTYPE, TRAINING
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
        self.device = device or self.params[0].device
        self.fused = bool(FUSE_OPTIM) if fused is None else fused
        self.state_dtype = to_dtype(OPTIM_DTYPE.value)
        self.lr = (
            Tensor(lr, device=self.device, dtype=dtypes.float32)
            if CONST_LR
            else Tensor([lr], device=self.device, dtype=dtypes.float32).contiguous().realize().reshape(())
        )

    def zero_grad(self) -> None:
        for t in self.params:
            t.grad = None

    def _state(self, like: Tensor) -> Tensor:
        return Tensor.zeros(like.shape, dtype=self.state_dtype, device=like.device).contiguous().realize()

    def step(self) -> None:
        Tensor.realize(*self.schedule_step())

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
        raise NotImplementedError

    def _apply(self, t: Tensor, new_value: Tensor) -> Tensor:
        return t.assign(new_value.cast(t.dtype))


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
        self.b = [self._state(t) for t in self.params] if momentum else []

    def _direction(self, i: int, t: Tensor, g: Tensor) -> Tensor:
        """The step to subtract, already scaled by lr."""
        if self.classic:
            g = g * self.lr
        if self.momentum:
            b = self.b[i]
            new_b = b * self.momentum + g
            self._apply(b, new_b)
            g = g + new_b * self.momentum if self.nesterov else new_b
        return g if self.classic else g * self.lr

    def _updates(self) -> list[Tensor]:
        out = []
        for i, t in enumerate(self.params):
            g = t.grad.cast(self.state_dtype) + t.detach().cast(self.state_dtype) * self.weight_decay  # type: ignore[union-attr]
            out.append(self._apply(t, t.detach() - self._direction(i, t, g)))
        return out + self.b


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

    def _updates(self) -> list[Tensor]:
        out = []
        for i, t in enumerate(self.params):
            w, g = t.detach().cast(self.state_dtype), t.grad.cast(self.state_dtype)  # type: ignore[union-attr]
            w_norm, g_norm = (w * w).sum().sqrt(), (g * g).sum().sqrt()
            ratio = ((w_norm > 0) & (g_norm > 0)).where(self.tcoef * w_norm / (g_norm + self.lars_wd * w_norm), 1.0)
            g = (g + w * self.lars_wd) * ratio if self.pre_wd else g * ratio + w * self.lars_wd
            out.append(self._apply(t, t.detach() - self._direction(i, t, g)))
        return out + self.b


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
        if fused:
            raise ValueError("Muon orthogonalizes each matrix on its own: fused=True is not supported")
        super().__init__(params, lr, momentum, 0.0, nesterov, False, device, False)
        self.muon_wd, self.ns_steps, self.ns_coefficients = weight_decay, ns_steps, ns_coefficients

    def _updates(self) -> list[Tensor]:
        out = []
        for i, t in enumerate(self.params):
            w, g = t.detach().cast(self.state_dtype), t.grad.cast(self.state_dtype)  # type: ignore[union-attr]
            new_b = self.b[i] * self.momentum + g
            self._apply(self.b[i], new_b)
            update = g + new_b * self.momentum if self.nesterov else new_b
            if t.ndim >= 2:  # vectors (biases, norms) take the plain momentum step
                flat = update.reshape(t.shape[0], -1)
                update = flat.newton_schulz(self.ns_steps, self.ns_coefficients).reshape(t.shape)
            out.append(self._apply(t, w * (1.0 - self.lr * self.muon_wd) - update * self.lr))
        return out + self.b


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
        super().__init__(params, lr, device, fused)
        self.b1, self.b2, self.eps, self.weight_decay, self.adam = b1, b2, eps, weight_decay, adam
        # b**t kept in float64: 1 - 0.999**t in float32 would be off by ~5e-5 relative (torch uses Python doubles)
        self.b1_t = Tensor([1.0], dtype=dtypes.float64, device=self.device).contiguous().realize()
        self.b2_t = Tensor([1.0], dtype=dtypes.float64, device=self.device).contiguous().realize()
        self.m = [self._state(t) for t in self.params]
        self.v = [self._state(t) for t in self.params]

    def _updates(self) -> list[Tensor]:
        b1_t, b2_t = self.b1_t * self.b1, self.b2_t * self.b2
        out = []
        for t, m, v in zip(self.params, self.m, self.v):
            g = t.grad.cast(self.state_dtype)  # type: ignore[union-attr]
            new_m = m * self.b1 + g * (1.0 - self.b1)
            new_v = v * self.b2 + (g * g) * (1.0 - self.b2)
            m_hat = new_m / (1.0 - b1_t.reshape(())).cast(self.state_dtype)
            v_hat = new_v / (1.0 - b2_t.reshape(())).cast(self.state_dtype)
            w = t.detach().cast(self.state_dtype)
            up = m_hat / (v_hat.sqrt() + self.eps) + w * self.weight_decay
            if not self.adam:
                r1, r2 = (w * w).sum().sqrt(), (up * up).sum().sqrt()
                up = up * ((r1 > 0) & (r2 > 0)).where(r1 / r2, 1.0)
            out.append(self._apply(t, w - up * self.lr))
            out += [self._apply(m, new_m), self._apply(v, new_v)]
        return out + [self.b1_t.assign(b1_t), self.b2_t.assign(b2_t)]


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

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def schedule_step(self) -> list[Tensor]:
        return [t for o in self.optimizers for t in o.schedule_step()]


__all__ = ["Optimizer", "SGD", "LARS", "Muon", "LAMB", "Adam", "AdamW", "OptimizerGroup"]
