"""Other implementations of each kernel's math, for the seed benchmark table.

Every baseline takes the inputs of the kernel's `make_inputs` (JAX arrays). Anything it needs in
another form (torch tensors, another layout, int64 labels, a pre-scaled Q) is made up front by
its factory, never inside the timed call. Columns:

  xla                 `jax.jit(kernel.reference)`: XLA's own fusion (the matmul family's dots go
                      to cuBLAS or XLA's Triton GEMM emitter, as XLA's autotuner decides).
  xla_cublas          the matmul family's reference compiled with XLA's Triton GEMM off, so the
                      dot is cuBLAS.
  torch               PyTorch eager, the idiomatic library calls (F.softmax, F.layer_norm,
                      F.rms_norm, torch.var_mean, F.cross_entropy, torch.matmul = cuBLAS, ...).
  torch_compile       the same function through `torch.compile` (default mode).
  torch_compile_max   `torch.compile(mode="max-autotune-no-cudagraphs")` (opt-in: slow to compile).
  torch_sdpa[_flash|_cudnn]  F.scaled_dot_product_attention: PyTorch's own backend choice, or
                      forced to FlashAttention-2 or cuDNN.
  cudnn               `jax.nn.dot_product_attention(implementation="cudnn")` on (B, S, H, D)
                      copies of the inputs.
  pallas_ops_triton   JAX's shipped Pallas Triton ops (jax.experimental.pallas.ops.gpu: softmax,
                      layer_norm, rms_norm and its backward, mha) at their default configs.
  pallas_ops_mgpu     JAX's shipped Mosaic GPU ops: the Hopper matmul (ops/gpu/hopper_matmul_mgpu)
                      at the config of the module's own example, and attention_mgpu.

`BASELINES[kernel][column]` is a factory `Case -> Prepared`; it raises `Unavailable` when the
column cannot run here (no GPU, no torch, an op missing from this JAX), which is reported as
such. `check` compares a prepared baseline with the kernel's reference (farm.measure.validate's relative
L2 error) before anything is timed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from farm.measure import validate

CPU_ONLY = "unavailable on cpu"


class Unavailable(Exception):
    """This column cannot run here; the message says why."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel at one shape and dtype, with its input sets (JAX arrays, `make_inputs` order)."""

    module: ModuleType
    shape: tuple[int, ...]
    dtype: str
    input_sets: Sequence[tuple[Any, ...]]

    @property
    def gpu(self) -> bool:
        """Whether JAX runs on a CUDA GPU here."""
        return on_gpu()


class _TorchPending:
    """A queued torch result that `jax.block_until_ready` can wait for (it calls this method)."""

    __slots__ = ("value", "_sync")

    def __init__(self, value: Any, sync: Callable[[], None]) -> None:
        self.value, self._sync = value, sync

    def block_until_ready(self) -> _TorchPending:
        self._sync()
        return self


@dataclasses.dataclass
class Prepared:
    """A baseline ready to check and time: `fn(*inputs[i])` is the timed call."""

    fn: Callable[..., Any]
    inputs: list[tuple[Any, ...]]
    to_reference: Callable[[Any], Any] = lambda out: out
    framework: str = "jax"                  # "jax" or "torch": how to wait for it, which clock checks it
    sync: Callable[[], None] = lambda: None  # torch: waits for the device
    note: str = ""

    def call(self, i: int) -> Any:
        """Queue one call on input set i (mod the number of sets); works with jax.block_until_ready."""
        out = self.fn(*self.inputs[i % len(self.inputs)])
        return out if self.framework == "jax" else _TorchPending(out, self.sync)

    def raw_output(self, i: int = 0) -> Any:
        """One call's result, waited for, as the column returns it (torch tensors for torch)."""
        out = jax.block_until_ready(self.call(i))
        return out.value if isinstance(out, _TorchPending) else out

    def output(self, i: int = 0) -> Any:
        """One call's result, waited for, in the reference's layout (JAX arrays)."""
        return self.to_reference(self.raw_output(i))


def strided_layout(out: Any) -> str | None:
    """How a column's raw output (a tensor or a tuple of them) falls short of a dense array, or None.
    torch may return a view of a larger buffer: torch.compile pads a product of 50257 columns to
    50264 and returns (4096, 50257) with strides (50264, 1) (H200, BENCHMARKS.md). The column's
    time then leaves out the compaction that a dense result, as every JAX array is, needs."""
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if callable(getattr(t, "is_contiguous", None)) and not t.is_contiguous():
            return f"a strided view, shape {tuple(t.shape)}, strides {tuple(t.stride())} (not compacted)"
    return None


Factory = Callable[[Case], Prepared]


def same_bytes_copy(n_bytes: int, n_sets: int = 1, gpu: bool | None = None) -> Prepared:
    """A copy of a bf16 vector whose read + write bytes are `n_bytes` (a row's), over `n_sets`
    input sets (as the row rotates its own): the copy ceiling at the row's size, where launch,
    ramp-up and the last wave weigh as they do on the row's kernels. On a GPU with torch, torch's
    device-to-device copy (`Tensor.copy_`), the copy the seed table's ceiling is measured with:
    XLA's copy (a negation, the fallback elsewhere) moved 3.32 TB/s on the H200 where torch's moved
    4.27 (2026-12-02), so it is no ceiling."""
    n = max(1, n_bytes // 4)
    sets = [(jax.random.normal(jax.random.key(200 + i), (n,), jnp.bfloat16),) for i in range(n_sets)]
    if on_gpu() if gpu is None else gpu:
        try:
            torch = _torch()
            device = torch.device("cuda", 0)
            tensors = [(to_torch(x, device),) for (x,) in sets]
            out = torch.empty_like(tensors[0][0])
            return Prepared(lambda v: out.copy_(v), tensors, framework="torch",
                            sync=lambda: torch.cuda.synchronize(device),
                            note=f"{n} bf16 elements read and written (torch copy_)")
        except Exception:  # noqa: BLE001 - no torch or no CUDA device for it: XLA's copy
            pass
    return Prepared(jax.jit(lambda v: -v), sets, note=f"{n} bf16 elements read and written (XLA negation)")


def on_gpu() -> bool:
    """Whether JAX's default backend is a CUDA GPU."""
    try:
        return jax.default_backend() == "gpu"
    except RuntimeError:
        return False


def _need_gpu(case: Case) -> None:
    if not case.gpu:
        raise Unavailable(CPU_ONLY)


# -- numerics --------------------------------------------------------------------------------

def _precision() -> Any:
    context = getattr(jax, "default_matmul_precision", None)
    return context("highest") if context is not None else contextlib.nullcontext()


def reference_output(case: Case, i: int = 0) -> Any:
    """The kernel's reference on input set i, upcast to float32, at full float32 matmul precision.

    Attention references run one batch entry at a time (`lax.map`): at the seed shape
    (8, 32, 8192, 256) the float32 scores of the whole batch alone are 69 GB.
    """
    inputs = validate.upcast(tuple(case.input_sets[i]))
    one = case.module.reference

    def per_batch_entry(*xs: jax.Array) -> jax.Array:
        return jax.lax.map(lambda entry: one(*(x[None] for x in entry))[0], xs)

    with _precision():
        return jax.jit(per_batch_entry if case.module.NAME in ATTENTION else one)(*inputs)


def temp_bytes(kernel: str, column: str, case: Case) -> int:
    """Device memory a column's temporaries need beyond inputs and outputs, where that is large.

    The naive attention columns (XLA's reference, torch eager and compiled math) materialise the
    (batch, heads, seq, seq) scores and probabilities: float32 in the reference, the input dtype
    in torch.
    """
    if kernel not in ATTENTION or column not in ("xla", "torch", "torch_compile", "torch_compile_max"):
        return 0
    batch, heads, seq, _ = case.shape
    itemsize = 4 if column == "xla" else jnp.dtype(case.dtype).itemsize
    return 2 * batch * heads * seq * seq * itemsize


relative_error = validate.relative_error   # float32 on the device for large outputs


def check(prepared: Prepared, case: Case, ref: Any | None = None) -> tuple[float, float]:
    """(relative L2 error against the reference on input set 0, the kernel's tolerance)."""
    ref = reference_output(case) if ref is None else ref
    return relative_error(prepared.output(0), ref), validate.tolerance(case.dtype, case.module)


# -- torch interop ---------------------------------------------------------------------------

def _torch() -> Any:
    try:
        import torch
    except ImportError as err:
        raise Unavailable(f"torch not importable: {err}") from None
    return torch


def _torch_device(case: Case) -> Any:
    torch = _torch()
    if not case.gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise Unavailable("torch sees no CUDA device")
    return torch.device("cuda", 0)


def to_torch(x: Any, device: Any) -> Any:
    """A JAX array as a torch tensor on `device`: zero-copy through DLPack, else copied via numpy."""
    torch = _torch()
    try:
        t = torch.from_dlpack(x)
        if t.device == device:
            return t
    except Exception:  # noqa: BLE001 - fall back to a host copy (setup only, never timed)
        pass
    dtype = jnp.dtype(x.dtype)
    if dtype == jnp.bfloat16:
        return torch.from_numpy(np.asarray(x.astype(jnp.float32))).to(device=device, dtype=torch.bfloat16)
    return torch.from_numpy(np.array(x)).to(device)


def to_jax(t: Any) -> jax.Array:
    """A torch tensor as a JAX array (zero-copy through DLPack when the devices agree)."""
    t = t.detach().contiguous()
    try:
        return jnp.from_dlpack(t)
    except Exception:  # noqa: BLE001 - fall back to a host copy (checking only, never timed)
        torch = _torch()
        if t.dtype == torch.bfloat16:
            return jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(t.cpu().numpy())


def _torch_outputs(out: Any) -> Any:
    if isinstance(out, (tuple, list)):
        return tuple(to_jax(t) for t in out)
    return to_jax(out)


@dataclasses.dataclass(frozen=True)
class TorchMath:
    """A kernel's math in torch: `make(case)` gives a function of the converted inputs."""

    make: Callable[[Case], Callable[..., Any]]
    convert: Callable[[tuple[Any, ...]], tuple[Any, ...]] = lambda ts: ts   # setup, not timed


def _torch_column(math_: TorchMath, mode: str | None) -> Factory:
    """Torch eager (mode "eager") or torch.compile with `mode` (None: the default mode)."""

    def factory(case: Case) -> Prepared:
        torch = _torch()
        device = _torch_device(case)
        fn = math_.make(case)
        if mode != "eager":
            fn = torch.compile(fn, mode=mode, dynamic=False)
        inputs = [math_.convert(tuple(to_torch(x, device) for x in s)) for s in case.input_sets]
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        note = f"torch {torch.__version__}" + (f", torch.compile mode={mode or 'default'}" if mode != "eager" else "")
        return Prepared(fn, inputs, _torch_outputs, framework="torch", sync=sync, note=note)

    return factory


def _F() -> Any:
    return _torch().nn.functional


def _t_softmax(case: Case) -> Callable[..., Any]:
    torch = _torch()
    return lambda x: torch.softmax(x, dim=-1)


def _t_layer_norm(case: Case) -> Callable[..., Any]:
    F, eps = _F(), case.module.EPS
    return lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps=eps)


def _t_rms_norm(case: Case) -> Callable[..., Any]:
    F, torch, eps = _F(), _torch(), case.module.EPS
    if hasattr(F, "rms_norm"):
        return lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps=eps)

    def rms_norm(x: Any, w: Any) -> Any:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    return rms_norm


def _t_rms_norm_bwd(case: Case) -> Callable[..., Any]:
    torch, eps = _torch(), case.module.EPS

    def rms_norm_bwd(x: Any, w: Any, dy: Any) -> tuple[Any, Any]:
        x32, dy32 = x.float(), dy.float()
        r = torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
        dyw = dy32 * w.float()
        dx = r * dyw - x32 * r.pow(3) * (dyw * x32).mean(-1, keepdim=True)
        dw = (dy32 * x32 * r).sum(0)
        return dx.to(x.dtype), dw.to(w.dtype)

    return rms_norm_bwd


def _t_welford(case: Case) -> Callable[..., Any]:
    torch = _torch()

    def welford(x: Any) -> tuple[Any, Any]:
        var, mean = torch.var_mean(x, dim=-1, correction=0)   # f32 accumulation, input-dtype result
        return mean.float(), var.float()

    return welford


def _t_cross_entropy(case: Case) -> Callable[..., Any]:
    F = _F()
    return lambda logits, labels: F.cross_entropy(logits, labels, reduction="none").float()


def _labels_long(ts: tuple[Any, ...]) -> tuple[Any, ...]:
    return ts[0], ts[1].long()


def _t_swiglu(case: Case) -> Callable[..., Any]:
    F = _F()
    return lambda a, b: F.silu(a) * b


def _t_geglu(case: Case) -> Callable[..., Any]:
    F = _F()
    return lambda a, b: F.gelu(a, approximate="tanh") * b


def _t_matmul(case: Case) -> Callable[..., Any]:
    return _torch().matmul


def _t_bmm(case: Case) -> Callable[..., Any]:
    return _torch().bmm


def _t_matmul_layernorm(case: Case) -> Callable[..., Any]:
    torch, F, eps = _torch(), _F(), case.module.EPS
    return lambda a, b, g, beta: F.layer_norm(torch.matmul(a, b), (b.shape[-1],), g, beta, eps=eps)


def _t_matmul_silu(case: Case) -> Callable[..., Any]:
    torch, F = _torch(), _F()
    return lambda a, b, bias: F.silu(torch.addmm(bias, a, b))


def _t_attention(causal: bool) -> Callable[[Case], Callable[..., Any]]:
    def make(case: Case) -> Callable[..., Any]:
        torch = _torch()
        seq, dim = case.shape[2], case.shape[3]
        scale = 1.0 / math.sqrt(dim)
        mask = None
        if causal:
            mask = torch.ones(seq, seq, dtype=torch.bool, device=_torch_device(case)).triu(1)

        def attention(q: Any, k: Any, v: Any) -> Any:
            s = torch.matmul(q, k.transpose(-1, -2)) * scale
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            return torch.matmul(torch.softmax(s, dim=-1), v)

        return attention

    return make


def _torch_sdpa(causal: bool, backend: str | None) -> Factory:
    """F.scaled_dot_product_attention on the (B, H, S, D) inputs, optionally one backend forced."""

    def factory(case: Case) -> Prepared:
        torch = _torch()
        if backend is not None:
            _need_gpu(case)
            from torch.nn.attention import SDPBackend, sdpa_kernel

            chosen = getattr(SDPBackend, backend)
        F = _F()

        def sdpa(q: Any, k: Any, v: Any) -> Any:
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            with sdpa_kernel([chosen]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        device = _torch_device(case)
        inputs = [tuple(to_torch(x, device) for x in s) for s in case.input_sets]
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        return Prepared(sdpa, inputs, _torch_outputs, framework="torch", sync=sync,
                        note=f"torch {torch.__version__}, backend {backend or 'auto'}")

    return factory


# -- JAX columns -----------------------------------------------------------------------------

def _xla(case: Case) -> Prepared:
    return Prepared(jax.jit(case.module.reference), [tuple(s) for s in case.input_sets], note="jax.jit(reference)")


def _xla_cublas(case: Case) -> Prepared:
    _need_gpu(case)
    sets = [tuple(s) for s in case.input_sets]
    try:
        compiled = jax.jit(case.module.reference).lower(*sets[0]).compile(
            compiler_options={"xla_gpu_enable_triton_gemm": False})
    except Exception as err:  # noqa: BLE001 - an XLA without the flag
        raise Unavailable(f"XLA rejected xla_gpu_enable_triton_gemm=False: {str(err)[:200]}") from None
    return Prepared(compiled, sets, note="reference compiled with xla_gpu_enable_triton_gemm=False")


def _transpose_in(case: Case, *, scale_q: float = 1.0, dtype: Any = None) -> list[tuple[jax.Array, ...]]:
    """(B, H, S, D) inputs as (B, S, H, D) copies, made before timing (optionally Q scaled, recast)."""
    sets = []
    for q, k, v in case.input_sets:
        if scale_q != 1.0:
            q = (q.astype(jnp.float32) * scale_q).astype(q.dtype)
        out = tuple(jnp.swapaxes(x, 1, 2) for x in (q, k, v))
        if dtype is not None:
            out = tuple(x.astype(dtype) for x in out)
        sets.append(jax.block_until_ready(out))
    return sets


def _bshd_to_bhsd(out: jax.Array, dtype: Any) -> jax.Array:
    return jnp.swapaxes(out, 1, 2).astype(dtype)


def _cudnn_attention(causal: bool) -> Factory:
    def factory(case: Case) -> Prepared:
        _need_gpu(case)
        fn = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=causal, implementation="cudnn"))
        return Prepared(fn, _transpose_in(case), functools.partial(_bshd_to_bhsd, dtype=case.dtype),
                        note="jax.nn.dot_product_attention(implementation='cudnn'), (B, S, H, D) inputs")

    return factory


def _ops(name: str) -> ModuleType:
    import importlib

    try:
        return importlib.import_module(f"jax.experimental.pallas.ops.gpu.{name}")
    except Exception as err:  # noqa: BLE001 - a JAX without this op
        raise Unavailable(f"jax.experimental.pallas.ops.gpu.{name} not importable: {str(err)[:200]}") from None


def _interpret(case: Case) -> bool:
    return not case.gpu   # on the CPU, Pallas interpret mode (to test the plumbing)


def _ops_softmax(case: Case) -> Prepared:
    op = _ops("softmax").softmax
    fn = jax.jit(functools.partial(op, axis=-1, interpret=_interpret(case)))
    return Prepared(fn, [tuple(s) for s in case.input_sets], note="ops.gpu.softmax, default num_warps")


def _leading_axis(case: Case, extra: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows as (1, rows, cols): the shipped norm ops vmap over two leading axes."""
    return [jax.block_until_ready(extra((s[0][None],) + tuple(s[1:]))) for s in case.input_sets]


def _ops_layer_norm(case: Case) -> Prepared:
    op, eps, interpret = _ops("layer_norm").layer_norm, case.module.EPS, _interpret(case)
    fn = jax.jit(lambda x, w, b: op(x, w, b, eps=eps, interpret=interpret))
    return Prepared(fn, _leading_axis(case, lambda s: s), lambda out: out[0], note="ops.gpu.layer_norm")


def _ops_rms_norm(case: Case) -> Prepared:
    op, eps, interpret = _ops("rms_norm").rms_norm, case.module.EPS, _interpret(case)
    fn = jax.jit(lambda x, w, b: op(x, w, b, eps=eps, interpret=interpret))
    inputs = _leading_axis(case, lambda s: (s[0], s[1], jnp.zeros_like(s[1])))
    return Prepared(fn, inputs, lambda out: out[0], note="ops.gpu.rms_norm with a zero bias")


def _ops_rms_norm_bwd(case: Case) -> Prepared:
    """The shipped backward (dx and dweight kernels) given the forward's saved rstd."""
    mod, eps, interpret = _ops("rms_norm"), case.module.EPS, _interpret(case)
    forward = jax.jit(lambda x, w, b: mod.rms_norm_forward(x, w, b, eps=eps, interpret=interpret)[1])
    backward = jax.jit(lambda x, w, b, rstd, dy: mod.rms_norm_backward(None, 3, eps, "triton", interpret,
                                                                         (x, w, b, rstd), dy))
    inputs = []
    for x, w, dy in case.input_sets:
        x3, b = x[None], jnp.zeros_like(w)
        rstd = forward(x3, w, b)[3]
        inputs.append(jax.block_until_ready((x3, w, b, rstd, dy[None])))
    return Prepared(backward, inputs, lambda out: (out[0][0], out[1]),
                    note="ops.gpu.rms_norm_backward given the forward's rstd; also computes dbias")


def _ops_mha(causal: bool) -> Factory:
    def factory(case: Case) -> Prepared:
        mod, interpret = _ops("attention"), _interpret(case)
        scale = 1.0 / math.sqrt(case.shape[3])
        fn = jax.jit(lambda q, k, v: mod.mha(q, k, v, None, sm_scale=scale, causal=causal, interpret=interpret))
        return Prepared(fn, _transpose_in(case), functools.partial(_bshd_to_bhsd, dtype=case.dtype),
                        note="ops.gpu.attention.mha, default block sizes, (B, S, H, D) inputs")

    return factory


def _dataclass_kwargs(cls: Any, wanted: dict[str, Any]) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in wanted.items() if k in fields}


def _mgpu_matmul_fn() -> tuple[Callable[..., Any], str]:
    """The Hopper Mosaic GPU matmul as a function of (a, b), at the module example's config."""
    mod = _ops("hopper_matmul_mgpu")
    # The config of the module's own example: 128 x 128 x 64 tiles, 4 steps in flight, a 64 x 64
    # epilogue; every other field at its default.
    wanted = {"tile_m": 128, "tile_n": 128, "tile_k": 64, "max_concurrent_steps": 4,
              "epi_tile_n": 64, "epi_tile_m": 64}
    config = mod.TuningConfig(**_dataclass_kwargs(mod.TuningConfig, wanted))
    entry = getattr(mod, "matmul", None) or getattr(mod, "matmul_kernel", None)
    if entry is None:
        raise Unavailable("hopper_matmul_mgpu has neither matmul nor matmul_kernel")
    params = inspect.signature(entry).parameters
    if "c" in params:
        def fn(a, b):
            return entry(a, b, None, config=config)
    else:
        def fn(a, b):
            return entry(a, b, config=config)
    return fn, f"ops.gpu.hopper_matmul_mgpu {config}"


def _mgpu_matmul(case: Case) -> Prepared:
    _need_gpu(case)
    fn, note = _mgpu_matmul_fn()
    return Prepared(jax.jit(fn), [tuple(s) for s in case.input_sets], note=note)


def _mgpu_bmm(case: Case) -> Prepared:
    _need_gpu(case)
    fn, note = _mgpu_matmul_fn()
    return Prepared(jax.jit(jax.vmap(fn)), [tuple(s) for s in case.input_sets], note=note + ", vmapped")


def _mgpu_broadcast_matmul(case: Case) -> Prepared:
    """A (batch, m, k) folded to (batch * m, k) before timing: one 2-D matmul against B."""
    _need_gpu(case)
    fn, note = _mgpu_matmul_fn()
    batch, m, n, _ = case.shape
    inputs = [jax.block_until_ready((a.reshape(batch * m, -1), b)) for a, b in case.input_sets]
    return Prepared(jax.jit(fn), inputs, lambda out: out.reshape(batch, m, n), note=note + ", batch folded into m")


def _mgpu_attention(causal: bool) -> Factory:
    """ops.gpu.attention_mgpu at its example's config (block_q 64, the largest block_kv that fits).

    It takes no softmax scale: Q is scaled by 1/sqrt(D) before timing. If the input dtype fails
    (JAX 0.10 stages tiles as float16), it runs on float16 copies of the inputs, and says so.
    """

    def factory(case: Case) -> Prepared:
        _need_gpu(case)
        mod = _ops("attention_mgpu")
        scale = 1.0 / math.sqrt(case.shape[3])
        errors = []
        for dtype in (jnp.dtype(case.dtype), jnp.dtype(jnp.float16)):
            inputs = _transpose_in(case, scale_q=scale, dtype=dtype)
            for block_kv in (256, 128, 64):
                wanted = {"block_q": 64, "block_kv": block_kv, "max_concurrent_steps": 2, "causal": causal}
                try:
                    config = mod.TuningConfig(**_dataclass_kwargs(mod.TuningConfig, wanted))
                    if causal and not getattr(config, "causal", False):
                        raise Unavailable("this attention_mgpu has no causal option")
                    fn = jax.jit(functools.partial(mod.attention, config=config)).lower(*inputs[0]).compile()
                except Unavailable:
                    raise
                except Exception as err:  # noqa: BLE001 - try the next block size / dtype
                    errors.append(f"{dtype.name} block_kv={block_kv}: {str(err).splitlines()[0][:160]}")
                    continue
                note = f"ops.gpu.attention_mgpu block_q=64 block_kv={block_kv} on {dtype.name}, Q pre-scaled"
                if dtype != jnp.dtype(case.dtype):
                    note += f" (float16 copies: {errors[0]})"
                return Prepared(fn, inputs, functools.partial(_bshd_to_bhsd, dtype=case.dtype), note=note)
        raise Unavailable("; ".join(errors[-3:]))

    return factory


# -- the registry ----------------------------------------------------------------------------

TORCH_MATH: dict[str, TorchMath] = {
    "softmax": TorchMath(_t_softmax),
    "batch_softmax": TorchMath(_t_softmax),
    "softmax_two_pass": TorchMath(_t_softmax),
    "layer_norm": TorchMath(_t_layer_norm),
    "rms_norm": TorchMath(_t_rms_norm),
    "rms_norm_bwd": TorchMath(_t_rms_norm_bwd),
    "welford": TorchMath(_t_welford),
    "cross_entropy": TorchMath(_t_cross_entropy, _labels_long),
    "swiglu": TorchMath(_t_swiglu),
    "geglu": TorchMath(_t_geglu),
    "matmul": TorchMath(_t_matmul),
    "bmm": TorchMath(_t_bmm),
    "broadcast_matmul": TorchMath(_t_matmul),
    "matmul_layernorm": TorchMath(_t_matmul_layernorm),
    "matmul_subtiled_epilogue": TorchMath(_t_matmul_silu),
    "flash_attention": TorchMath(_t_attention(causal=False)),
    "flash_attention_causal": TorchMath(_t_attention(causal=True)),
}

ATTENTION = ("flash_attention", "flash_attention_causal")
MATMUL_FAMILY = ("matmul", "bmm", "broadcast_matmul", "matmul_layernorm", "matmul_subtiled_epilogue")

EXTRA: dict[str, dict[str, Factory]] = {
    "softmax": {"pallas_ops_triton": _ops_softmax},
    "batch_softmax": {"pallas_ops_triton": _ops_softmax},
    "softmax_two_pass": {"pallas_ops_triton": _ops_softmax},
    "layer_norm": {"pallas_ops_triton": _ops_layer_norm},
    "rms_norm": {"pallas_ops_triton": _ops_rms_norm},
    "rms_norm_bwd": {"pallas_ops_triton": _ops_rms_norm_bwd},
    "matmul": {"pallas_ops_mgpu": _mgpu_matmul},
    "bmm": {"pallas_ops_mgpu": _mgpu_bmm},
    "broadcast_matmul": {"pallas_ops_mgpu": _mgpu_broadcast_matmul},
    **{name: {"torch_sdpa": _torch_sdpa(causal, None),
              "torch_sdpa_flash": _torch_sdpa(causal, "FLASH_ATTENTION"),
              "torch_sdpa_cudnn": _torch_sdpa(causal, "CUDNN_ATTENTION"),
              "cudnn": _cudnn_attention(causal),
              "pallas_ops_triton": _ops_mha(causal),
              "pallas_ops_mgpu": _mgpu_attention(causal)}
       for name, causal in (("flash_attention", False), ("flash_attention_causal", True))},
}

# Columns that only some runs want (slow to build); seed_table.py asks for them by flag.
OPT_IN = ("torch_compile_max",)


def _registry() -> dict[str, dict[str, Factory]]:
    table: dict[str, dict[str, Factory]] = {}
    for kernel, math_ in TORCH_MATH.items():
        columns: dict[str, Factory] = {"xla": _xla}
        if kernel in MATMUL_FAMILY:
            columns["xla_cublas"] = _xla_cublas
        columns["torch"] = _torch_column(math_, "eager")
        columns["torch_compile"] = _torch_column(math_, None)
        columns["torch_compile_max"] = _torch_column(math_, "max-autotune-no-cudagraphs")
        columns |= EXTRA.get(kernel, {})
        table[kernel] = columns
    return table


BASELINES: dict[str, dict[str, Factory]] = _registry()


def columns(kernel: str, *, opt_in: Sequence[str] = ()) -> dict[str, Factory]:
    """The baseline columns of `kernel` (empty for a kernel without baselines)."""
    return {name: f for name, f in BASELINES.get(kernel, {}).items() if name not in OPT_IN or name in opt_in}
