"""Runs attn's kernels on an emulated Sapphire Rapids CPU (AVX-512, AVX512-BF16 and
AVX512-FP16; the emulator is built without AMX), so that paths for CPU features this
machine lacks are tested wherever the tests run.

The emulator is BochsCPU (PyPI's bochscpu-python): Bochs' CPU alone, with no devices and no
operating system. tests/emulated builds the kernels into a shared object that links no
runtime (libattn_emulated_kernels.so; tests/emulated/freestanding_runtime.cpp has the
little they reach outside themselves) and the library that makes BochsCPU emulate Sapphire
Rapids (libbochscpu_shim.so); this module maps the first into the emulated address
space, sets up long mode with the AVX-512 state enabled, and calls one entry point
with rdi pointing at its argument struct. A call returns to a page holding `hlt`, which
faults in user mode and stops the emulator there; anything else that stops it is an error.
"""

import ctypes
import os
import struct
import subprocess

BUILD = os.environ.get(
    "ATTN_EMULATED_KERNELS_DIR",
    os.path.join(os.path.dirname(__file__), "..", "..", "build", "release", "tests", "emulated"))
KERNELS = os.path.join(BUILD, "libattn_emulated_kernels.so")
SHIM = os.path.join(BUILD, "libbochscpu_shim.so")

# Where things lie in the emulated address space (user mode, 4 KiB pages).
_CODE, _DATA, _STACK, _RETURN = 0x4000_0000, 0x5000_0000, 0x6000_0000, 0x7000_0000
_DATA_BYTES, _STACK_BYTES = 8 << 20, 64 << 10
_PML4 = 0x10_0000

# XCR0: x87, SSE, AVX; AVX-512's opmask and upper ZMM state.
_XCR0 = 0x7 | 0xE0
_CR4_OSFXSR, _CR4_OSXMMEXCPT, _CR4_OSXSAVE = 1 << 9, 1 << 10, 1 << 18


def _load_segments(path):
    """The PT_LOAD segments of an ELF64 shared object: (address, file bytes, memory size)."""
    blob = open(path, "rb").read()
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError(f"{path}: not an ELF64 file")
    phoff, = struct.unpack_from("<Q", blob, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", blob, 0x36)
    segments = []
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz, memsz, _ = struct.unpack_from(
            "<IIQQQQQQ", blob, phoff + i * phentsize)
        if kind == 1:
            segments.append((_CODE + vaddr, blob[offset:offset + filesz], memsz))
    return segments


def _relocations(path):
    """The dynamic relocations of a shared object as (address, value) at _CODE: RELATIVE
    ones, and those of symbols it defines itself (static members of templates are bound
    through the GOT even with -Bsymbolic). References to undefined symbols stay 0; the code
    that would use them (the library's dispatch) is not run."""
    out = subprocess.run(["readelf", "-rW", path], capture_output=True, text=True,
                         check=True).stdout
    patches = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4 or not fields[2].startswith("R_X86_64_"):
            continue
        offset, kind = int(fields[0], 16), fields[2]
        if kind == "R_X86_64_RELATIVE":
            patches.append((_CODE + offset, _CODE + int(fields[3], 16)))
        elif kind in ("R_X86_64_GLOB_DAT", "R_X86_64_JUMP_SLOT", "R_X86_64_64"):
            value = int(fields[3], 16)
            addend = int(fields[-1], 16) if kind == "R_X86_64_64" and fields[-2] == "+" else 0
            if value != 0:
                patches.append((_CODE + offset, _CODE + value + addend))
        else:
            raise ValueError(f"{path}: relocation {kind} is not handled")
    return patches


def _symbols(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return {name: _CODE + int(value, 16) for value, _, name in (line.split() for line in
                                                                 out.splitlines())}


class Emulator:
    """One emulated CPU with the kernels mapped; call() runs one entry point on data put in
    its data area by put()."""

    def __init__(self, kernels=KERNELS, shim=SHIM):
        for path in (kernels, shim):
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} is missing: build the release preset first "
                                        "(cmake --build --preset release)")
        # Before bochscpu is imported: its CPU model is chosen when its CPU is made.
        ctypes.CDLL(shim, mode=os.RTLD_GLOBAL)
        import bochscpu
        import bochscpu.cpu
        import bochscpu.memory
        self._bochs = bochscpu
        self._page = bochscpu.memory.page_size()
        self._session = bochscpu.Session()
        self._session.missing_page_handler = self._missing_page
        self._table = bochscpu.memory.PageMapLevel4Table()
        self._next_physical = 0x100_0000
        self._mapped = set()
        segments = _load_segments(kernels)
        for address, _, size in segments:
            self._map(address, size)
        self._map(_DATA, _DATA_BYTES)
        self._map(_STACK, _STACK_BYTES)
        self._map(_RETURN, self._page)
        for host, physical in self._table.commit(_PML4):
            bochscpu.memory.page_insert(physical, host)
        for address, data, size in segments:
            self.write(address, data + bytes(size - len(data)))
        for address, value in _relocations(kernels):
            self.write(address, struct.pack("<Q", value))
        self.write(_RETURN, b"\xf4")  # hlt
        self.symbols = _symbols(kernels)
        self._free = _DATA

    def _missing_page(self, physical):
        raise RuntimeError(f"the emulated CPU read unmapped memory at {physical:#x}")

    def _map(self, address, size):
        for page in range(address // self._page * self._page, address + size, self._page):
            if page in self._mapped:
                continue
            host = self._bochs.memory.allocate_host_page()
            self._bochs.memory.page_insert(self._next_physical, host)
            self._table.insert(page, self._next_physical, 1)
            self._mapped.add(page)
            self._next_physical += self._page

    def write(self, address, data):
        data = bytes(data)
        done = 0
        while done < len(data):
            n = min(len(data) - done, self._page - (address + done) % self._page)
            if not self._bochs.memory.virt_write(_PML4, address + done, list(data[done:done + n])):
                raise RuntimeError(f"cannot write emulated memory at {address + done:#x}")
            done += n

    def read(self, address, size):
        out = bytearray()
        while len(out) < size:
            n = min(size - len(out), self._page - (address + len(out)) % self._page)
            out += bytes(self._bochs.memory.virt_read(_PML4, address + len(out), n))
        return bytes(out)

    def reset_data(self):
        """Frees the data area for the next call's arguments."""
        self._free = _DATA

    def put(self, data, align=64):
        """Copies data into the data area; returns its emulated address."""
        address = (self._free + align - 1) // align * align
        if address + len(data) > _DATA + _DATA_BYTES:
            raise MemoryError("the emulated data area is full")
        self.write(address, data)
        self._free = address + len(data)
        return address

    def call(self, symbol, argument_address):
        """Runs symbol(argument_address) to its return; returns rax (an int result)."""
        bochscpu = self._bochs
        state = bochscpu.State()
        bochscpu.cpu.set_long_mode(state)
        cr0 = bochscpu.cpu.ControlRegister(state.cr0)
        cr0.MP, cr0.EM = True, False
        state.cr0 = int(cr0)
        state.cr4 = state.cr4 | _CR4_OSFXSR | _CR4_OSXMMEXCPT | _CR4_OSXSAVE
        state.xcr0 = _XCR0
        state.mxcsr = 0x1F80
        state.cr3 = _PML4
        state.rsp = _STACK + _STACK_BYTES - 64
        self.write(state.rsp, struct.pack("<Q", _RETURN))
        state.rip = self.symbols[symbol]
        state.rdi = argument_address
        code, data = bochscpu.Segment(), bochscpu.Segment()
        for segment, selector, attributes in ((code, 0x33, 0x22FB), (data, 0x2B, 0xCF3)):
            segment.present, segment.selector, segment.attr = True, selector, attributes
            segment.base, segment.limit = 0, 0xFFFF_FFFF
        state.cs = code
        state.ds = state.ss = state.es = state.fs = state.gs = data
        self._session.cpu.state = state
        stops = []

        def on_exception(session, cpu, vector, error):
            stops.append((vector, session.cpu.state.rip))
            session.stop()

        hook = bochscpu.Hook()
        hook.exception = on_exception
        self._session.run([hook])
        rip = self._session.cpu.state.rip
        if rip not in (_RETURN, _RETURN + 1):
            raise RuntimeError(f"{symbol} stopped at {rip:#x} (exceptions: {stops}), not at its return")
        return self._session.cpu.state.rax
