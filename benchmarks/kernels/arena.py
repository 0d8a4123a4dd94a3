"""Memory the timer shares with the candidate's process: made fresh per batch, handed over only at "go".

The timer allocates an arena, writes the batch's inputs and NaN-filled outputs into it, and
passes it to the candidate's process with the message that starts the clock: on a CPU an
anonymous ``memfd`` (the fd travels over the unix socket; no path names it), on a GPU a
``cudaMalloc`` allocation and its CUDA IPC handle. Before that message the candidate's
process holds no way to read the inputs, so it cannot start computing before the clock
does. Tensors are described by ``Placed`` records (byte offset, dtype, shape, strides), so
both processes see the same layout; every tensor starts at a 256-byte boundary.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

ALIGNMENT_BYTES = 256
_IPC_HANDLE_BYTES = 64


@dataclass(frozen=True)
class Placed:
    """Where one tensor lies in an arena."""

    offset: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        """The record as a message carries it."""
        return {"offset": self.offset, "dtype": self.dtype, "shape": list(self.shape), "strides": list(self.strides)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Placed:
        """The record back from a message."""
        return Placed(int(data["offset"]), str(data["dtype"]), tuple(data["shape"]), tuple(data["strides"]))


def span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Storage elements a tensor of this shape and these strides spans."""
    if any(size == 0 for size in shape):
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(shape, strides, strict=True) if size > 1)


class Layout:
    """Places tensors one after another, each at a 256-byte boundary."""

    def __init__(self) -> None:
        self.nbytes = 0

    def place(self, shape: Sequence[int], dtype: torch.dtype, strides: Sequence[int] | None = None) -> Placed:
        """Room for one tensor (contiguous unless ``strides`` are given, e.g. a broadcast's zeros)."""
        if strides is None:
            strides = contiguous_strides(shape)
        offset = -(-self.nbytes // ALIGNMENT_BYTES) * ALIGNMENT_BYTES
        self.nbytes = offset + max(1, span(shape, strides)) * dtype.itemsize
        return Placed(offset, str(dtype).removeprefix("torch."), tuple(shape), tuple(strides))


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(1, int(size))
    return tuple(reversed(strides))


def view(base: torch.Tensor, placed: Placed, typed: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The tensor ``placed`` describes, viewing the arena's bytes ``base`` (``typed``: a cache of
    ``base`` viewed per dtype, which makes a view one ``as_strided``)."""
    typed = {} if typed is None else typed
    if placed.dtype not in typed:
        typed[placed.dtype] = base.view(getattr(torch, placed.dtype))
    flat = typed[placed.dtype]
    return flat.as_strided(placed.shape, placed.strides, placed.offset // flat.element_size())


def _own_storage(mapping: mmap.mmap, placed: Placed) -> torch.Tensor:
    """The tensor ``placed`` describes, on a storage of its own over its bytes of a CPU arena (Triton's
    interpreter copies a tensor's whole storage at every launch: one storage for the arena made a
    batch of ten calls copy ten calls' memory per argument)."""
    dtype = getattr(torch, placed.dtype)
    count = max(1, span(placed.shape, placed.strides))
    return torch.frombuffer(mapping, dtype=dtype, count=count, offset=placed.offset).as_strided(
        placed.shape, placed.strides
    )


class Arena:
    """One batch's memory, allocated by the timer: ``base`` (bytes) and what hands it over (``share``)."""

    def __init__(self, nbytes: int, device: torch.device):
        self.nbytes = -(-max(1, nbytes) // ALIGNMENT_BYTES) * ALIGNMENT_BYTES  # any dtype can view it
        self.device = device
        self._typed: dict[str, torch.Tensor] = {}
        if device.type == "cuda":
            self._cuda = _CudaAllocation(self.nbytes, device)
            self.base = self._cuda.tensor
        else:
            self._fd = os.memfd_create("evolve-kernels-arena", os.MFD_CLOEXEC)
            os.ftruncate(self._fd, self.nbytes)
            self._map = mmap.mmap(self._fd, self.nbytes)
            self.base = torch.frombuffer(self._map, dtype=torch.uint8)

    def view(self, placed: Placed) -> torch.Tensor:
        """The tensor ``placed`` describes, in this arena."""
        if self.device.type == "cuda":
            return view(self.base, placed, self._typed)
        return _own_storage(self._map, placed)

    def share(self) -> tuple[dict[str, Any], tuple[int, ...]]:
        """The message part and the fds that let the candidate's process attach this arena."""
        if self.device.type == "cuda":
            return {"nbytes": self.nbytes, "ipc": self._cuda.handle().hex()}, ()
        return {"nbytes": self.nbytes}, (self._fd,)

    def close(self) -> None:
        """Free the memory (call once the candidate's process has let go of it)."""
        self.base = None  # type: ignore[assignment]
        self._typed.clear()
        if self.device.type == "cuda":
            self._cuda.free()
            return
        os.close(self._fd)
        with contextlib.suppress(BufferError):  # a view of the timer's is still alive: it keeps the mapping
            self._map.close()


class Attached:
    """The candidate's process's view of an arena (``attach``); ``close`` lets go of it."""

    def __init__(self, share: dict[str, Any], fds: Sequence[int], device: torch.device):
        nbytes = int(share["nbytes"])
        self.device = device
        self._typed: dict[str, torch.Tensor] = {}
        if device.type == "cuda":
            self._cuda = _CudaAllocation.open(bytes.fromhex(share["ipc"]), nbytes, device)
            self.base = self._cuda.tensor
        else:
            if len(fds) != 1:
                raise ValueError(f"a CPU arena comes with one fd, got {len(fds)}")
            self._map = mmap.mmap(fds[0], nbytes)
            os.close(fds[0])
            self.base = torch.frombuffer(self._map, dtype=torch.uint8)

    def view(self, placed: Placed) -> torch.Tensor:
        """The tensor ``placed`` describes, in this arena."""
        if self.device.type == "cuda":
            return view(self.base, placed, self._typed)
        return _own_storage(self._map, placed)

    def close(self) -> None:
        """Unmap the arena (views made from ``base`` must be gone)."""
        self.base = None  # type: ignore[assignment]
        self._typed.clear()
        if self.device.type == "cuda":
            self._cuda.close_ipc()
            return
        with contextlib.suppress(BufferError):  # the candidate kept a view: it keeps the mapping
            self._map.close()


# --- CUDA: raw allocations and IPC handles through the CUDA runtime torch has loaded ----------


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _IPC_HANDLE_BYTES)]


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime library torch uses (already loaded, so found by its soname)."""
    torch.cuda.init()
    version = torch.version.cuda or ""
    major = version.split(".")[0]
    for name in (f"libcudart.so.{major}", f"libcudart.so.{version}", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError(f"the CUDA runtime (libcudart.so.{major}) torch uses cannot be loaded by name")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with CUDA error {status}")


class _CudaArray:
    """A raw device pointer exposed through ``__cuda_array_interface__`` (bytes)."""

    def __init__(self, pointer: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 3, "strides": None}  # fmt: skip


class _CudaAllocation:
    """``cudaMalloc``'d bytes (or an opened IPC handle's) viewed as a uint8 tensor."""

    def __init__(self, nbytes: int, device: torch.device, pointer: int | None = None):
        self.lib = _cudart()
        self.device = device
        with torch.cuda.device(device):
            if pointer is None:
                raw = ctypes.c_void_p()
                _check(self.lib.cudaMalloc(ctypes.byref(raw), ctypes.c_size_t(nbytes)), "cudaMalloc")
                pointer = int(raw.value or 0)
            self.pointer = pointer
            self.tensor = torch.as_tensor(_CudaArray(pointer, nbytes), device=device)

    @classmethod
    def open(cls, handle: bytes, nbytes: int, device: torch.device) -> _CudaAllocation:
        """The allocation another process exported (``handle``), mapped into this one."""
        lib = _cudart()
        raw = ctypes.c_void_p()
        with torch.cuda.device(device):
            _check(lib.cudaIpcOpenMemHandle(ctypes.byref(raw), _IpcHandle.from_buffer_copy(handle), ctypes.c_uint(1)),
                   "cudaIpcOpenMemHandle")  # fmt: skip
        return cls(nbytes, device, int(raw.value or 0))

    def handle(self) -> bytes:
        """The IPC handle another process opens this allocation with."""
        handle = _IpcHandle()
        _check(self.lib.cudaIpcGetMemHandle(ctypes.byref(handle), ctypes.c_void_p(self.pointer)),
               "cudaIpcGetMemHandle")  # fmt: skip
        return ctypes.string_at(ctypes.addressof(handle), _IPC_HANDLE_BYTES)

    def free(self) -> None:
        """Release the allocation (its exporter's side)."""
        self.tensor = None
        torch.cuda.synchronize(self.device)
        _check(self.lib.cudaFree(ctypes.c_void_p(self.pointer)), "cudaFree")

    def close_ipc(self) -> None:
        """Unmap an opened IPC allocation (its importer's side)."""
        self.tensor = None
        torch.cuda.synchronize(self.device)
        _check(self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(self.pointer)), "cudaIpcCloseMemHandle")
