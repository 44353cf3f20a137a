"""LLVM IR -> optimised object code or PTX (llvmlite), split between this process and a helper
process, with kernels cached by structure.

llvmlite runs every LLVM call behind one process-wide lock, so a process optimises and generates
one module at a time, on one core, and that is about 40 % of compiling a model. A module's kernels
are independent functions, so `emit_objects` cuts the module into parts: the host code (every
function but the kernels, which it declares), and each kernel alone with only what it refers to
(`Functions.kernel`). This process and a helper process (this file, run as a script: it imports
nothing but llvmlite and the standard library) each take the next part as they finish one; the
parts' objects link into one shared object. Host code that LLVM does not optimise (`optnone`) gets
the quick code generator. A CUDA module's kernels are parts too, each compiled to PTX
(`ptx_part`), which `targets/cuda.py` joins.

A kernel's part is named by its structure (`__disc_k_<digest>`: the same loop in another function,
another model or another process has the same text, whatever its name there), and the link
defines the kernel's own name as that symbol. Its object is kept in this process, and with
`DISC_CACHE_DIR` set also on disk (`KernelCache`; a kernel's PTX and the cubin of a PTX module
too): a compilation generates code only for kernels not seen before.

The helper starts in the background when the compilation of a module big enough to have several
kernels starts (`start_helper`), takes work once it has loaded llvmlite (a compilation that finds
it still starting, or busy with another module, compiles everything here), and exits with its
parent (end of its input). `DISC_COMPILE_HELPER=0` keeps all code generation in the calling process."""

from __future__ import annotations

import collections
import ctypes
import functools
import hashlib
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence

import llvmlite.binding as llvm

Spec = tuple[str, str, str, int]  # target triple, CPU, features, vector bits

# Vectorised loops keep math as vector intrinsics (llvm.exp.v16f32), which code generation would
# split into one libm call per lane. glibc's libmvec has vector versions of these functions
# (x86 vector-function ABI: _ZGV<isa>N<lanes>v_<name>, isa b=SSE, d=AVX2, e=AVX-512).
# (not atan2: libmvec's atan2f lost 3 digits of a complex pow's imaginary part in the conformance suite)
_VECTOR_MATH = {"exp", "log", "sin", "cos", "tan", "tanh", "exp2", "log2", "log10", "pow", "asin", "acos", "atan",
                "sinh", "cosh"}
_VECTOR_INTRINSIC = re.compile(r"llvm\.(\w+)\.v(\d+)(f32|f64)")
_ISA = {128: "b", 256: "d", 512: "e"}


@functools.cache
def _libmvec() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libmvec.so.1")
    except OSError:
        return None


def _libmvec_name(intrinsic: str, vector_bits: int) -> str | None:
    """The libmvec function for a vector math intrinsic (`llvm.exp.v16f32` -> `_ZGVeN16v_expf`)
    no wider than the target's vectors, or None."""
    m = _VECTOR_INTRINSIC.fullmatch(intrinsic)
    if not m or m.group(1) not in _VECTOR_MATH or _libmvec() is None:
        return None
    fn, lanes, elem = m.group(1), int(m.group(2)), m.group(3)
    bits = lanes * (32 if elem == "f32" else 64)
    isa = _ISA.get(bits) if bits <= vector_bits else None
    name = f"_ZGV{isa}N{lanes}{'vv' if fn == 'pow' else 'v'}_{fn}{'f' if elem == 'f32' else ''}"
    return name if isa is not None and hasattr(_libmvec(), name) else None


# MLIR's LLVM (newer than llvmlite's) prints some float constants in forms llvmlite's parser
# rejects: words (`-inf`, `+qnan`, NaNs with a payload: `+nan(0x123)` quiet, `-snan(0x1)`
# signalling), raw bits (`f0x3727C5AC`), and shortest decimals that are not exact doubles
# (`2.326820e-02` for a float). Each is rewritten to the classic hexadecimal form
# of its type, found as the nearest type word before it on the line (`phi float [ -inf, ...]`).
# One scan over a line: type words and the line start are matched with the literals, in order;
# strings (an error message, a GPU image's bytes) are matched whole and left as they are.
_TOKEN_RE = re.compile(r'(?P<string>"[^"]*")|'  # (LLVM escapes a quote inside a string: \22)
                       r"(?P<nl>\n[ \t]*(?P<skip>;|!|source_filename|target)?)|\b(?P<type>half|bfloat|float|double)\b"
                       r"|(?<![\w.%@])(?:f0x(?P<bits>[0-9A-Fa-f]{4}|[0-9A-Fa-f]{8}|[0-9A-Fa-f]{16})"
                       r"|(?P<word>(?P<sign>[+-]?)(?:inf|(?P<nan>q?nan|snan)(?:\((?P<payload>0x[0-9A-Fa-f]+)\))?))"
                       r"|(?P<dec>[+-]?\d+\.\d+(?:e[+-]?\d+)?))(?![\w.])")


def _hex_literal(value: float, type_name: str) -> str:
    if type_name == "half":
        return f"0xH{struct.unpack('<H', struct.pack('<e', value))[0]:04X}"
    if type_name == "bfloat":
        return f"0xR{struct.unpack('<I', struct.pack('<f', value))[0] >> 16:04X}"
    if type_name == "float":  # written as the double it widens to
        value = struct.unpack("<f", struct.pack("<f", value))[0]
    return f"0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016X}"


# per type: exponent bits all set, the quiet bit, and the sign bit (where the bits of a NaN go)
_NAN_BITS = {"half": (0x7C00, 0x200, 0x8000), "bfloat": (0x7F80, 0x40, 0x8000), "float": (0x7F800000, 0x400000, 1 << 31),
             "double": (0x7FF << 52, 1 << 51, 1 << 63)}


def _nan_literal(kind: str, sign: str, payload: int, type_name: str) -> str:
    """A NaN of `type_name` with its sign, quiet or signalling kind and payload, in the classic
    form (a float as the double it widens to: its 23 mantissa bits on top of the double's 52)."""
    exponent, quiet, sign_bit = _NAN_BITS[type_name]
    bits = exponent | (0 if kind == "snan" else quiet) | payload | (sign_bit if sign == "-" else 0)
    if type_name == "half":
        return f"0xH{bits:04X}"
    if type_name == "bfloat":
        return f"0xR{bits:04X}"
    if type_name == "float":
        bits = ((bits >> 31) << 63) | (0x7FF << 52) | ((bits & 0x7FFFFF) << 29)
    return f"0x{bits:016X}"


# where a literal the rewrite may change can start (a superset of _TOKEN_RE's literals): most lines
# of a module have none, and only the lines that have one are scanned token by token; strings are
# matched whole, to be passed over at once
_CANDIDATE_RE = re.compile(r'"[^"]*"|(?<![\w.%@])(?:f0x|[+-]?(?:inf|q?nan|snan)|[+-]?\d+\.\d)')


def classic_float_literals(llvm_ir: str) -> str:
    """Linear in the text: the lines with a candidate literal are rewritten, each token looked at
    once with the line's last type word so far."""
    parts, done = [], 0
    for m in _CANDIDATE_RE.finditer(llvm_ir):
        if m.start() < done or m.group(0)[0] == '"':
            continue  # on a line already rewritten, or a string
        start = llvm_ir.rfind("\n", 0, m.start()) + 1
        end = llvm_ir.find("\n", m.end())
        end = len(llvm_ir) if end < 0 else end
        parts += [llvm_ir[done:start], _classic_line(llvm_ir[start:end])]
        done = end
    parts.append(llvm_ir[done:])
    return "".join(parts)


def _classic_line(line: str) -> str:
    line_type: list[str | None] = [None]
    skip_line = [False]

    def sub(m: re.Match) -> str:
        if m.group("string") is not None:
            return m.group(0)
        if m.group("nl") is not None:
            line_type[0], skip_line[0] = None, m.group("skip") is not None
            return m.group(0)
        if m.group("type"):
            line_type[0] = m.group("type")
            return m.group(0)
        last = line_type[0]
        if skip_line[0]:
            return m.group(0)
        if m.group("bits"):  # raw bits: 4 hex digits half or bfloat, 8 float, 16 double
            bits = m.group("bits")
            if len(bits) == 4:
                return ("0xR" if last == "bfloat" else "0xH") + bits.upper()
            if len(bits) == 16:
                return "0x" + bits.upper()
            return _hex_literal(struct.unpack("<f", struct.pack("<I", int(bits, 16)))[0], "double")
        if last is None or (m.group("dec") and last == "double"):
            return m.group(0)
        if m.group("nan"):
            return _nan_literal(m.group("nan"), m.group("sign"), int(m.group("payload") or "0", 16), last)
        word = m.group("word") or m.group("dec")
        return _hex_literal(float(word.replace("q", "")), last)
    return _TOKEN_RE.sub(sub, "\n" + line)[1:]


class LLVMRejected(Exception):
    """LLVM's parser or verifier rejected the module (the message says where)."""


def compile_part(llvm_ir: str, spec: Spec, globals_elsewhere: bool = False) -> tuple[bytes, bool]:
    """The object for `llvm_ir` (without its exported globals when `globals_elsewhere`: another
    part defines them); says whether it calls libmvec."""
    triple, cpu, features, vector_bits = spec
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = _parse(llvm_ir)
    if globals_elsewhere:
        for value in mod.global_variables:
            if not value.is_declaration and value.linkage not in (llvm.Linkage.private, llvm.Linkage.internal):
                value.linkage = llvm.Linkage.available_externally
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=codegen_level(mod),
                                                               reloc="pic", codemodel="default")
    mod.triple = triple
    mod.data_layout = str(tm.target_data)
    # O2 with loop vectorisation (the kernels are loop nests). Unrolling multiplied compile time
    # by 4 on the encoder layer (14 s -> 3 s without it) and SLP vectorisation took 0.2-0.4 s of its
    # ~1.4 s, neither with a measured run-time gain
    pto = llvm.create_pipeline_tuning_options(speed_level=2)
    pto.loop_vectorization = True
    pto.slp_vectorization = False
    pto.loop_unrolling = False
    pb = llvm.create_pass_builder(tm, pto)
    # a loop interleaved 4 times (`loops.interleave_long_loops`) would leave its remainder to a loop of
    # half-width vectors, at half the rate on short rows: the remainder gets full f32 vectors
    # (an LLVM option: process-wide, so set for this module's passes only, and then reset; a
    # compilation in another thread of this process may see it reset early: its remainders are
    # then half-width, and still correct)
    llvm.set_option("", f"-epilogue-vectorization-force-VF={vector_bits // 32}")
    try:
        pb.getModulePassManager().run(mod, pb)
    finally:
        llvm.set_option("", "-epilogue-vectorization-force-VF=1")  # LLVM's default: not forced
    uses_libmvec = False
    for fn in mod.functions:  # renamed declarations stop being intrinsics: their calls call libmvec
        name = _libmvec_name(fn.name, vector_bits) if fn.is_declaration else None
        if name is not None:
            fn.name, uses_libmvec = name, True
    return tm.emit_object(mod), uses_libmvec


def _parse(llvm_ir: str) -> llvm.ModuleRef:
    try:
        mod = llvm.parse_assembly(classic_float_literals(llvm_ir))
        mod.verify()
    except RuntimeError as e:
        raise LLVMRejected(str(e)) from None
    return mod


def ptx_part(llvm_ir: str, spec: Spec, library: bytes) -> tuple[bytes, bool]:
    """The PTX of one kernel's part (`Functions.kernel`), and False (no libmvec): `library` (the
    bitcode of device math functions, or empty) linked, everything but the kernel internal,
    optimised at O3. The part's other functions and globals are named after the kernel's symbol
    (`<symbol>$<n>`), so that the PTX of several kernels can be concatenated (`targets/cuda.py`)."""
    triple, cpu, features, _ = spec
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    mod = _parse(llvm_ir)
    kernel = next(fn.name for fn in mod.functions if fn.name.startswith(KERNEL_STEM) and fn.linkage == llvm.Linkage.external
                  and not fn.is_declaration)
    if library:
        mod.link_in(llvm.parse_bitcode(library))
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=3)
    mod.triple = triple
    mod.data_layout = str(tm.target_data)
    optimise_device_module(mod, tm, [kernel])
    own = [v for v in [*mod.functions, *mod.global_variables] if not v.is_declaration and v.name != kernel
           and not v.name.startswith("llvm.")]
    for i, v in enumerate(own):
        v.name = f"{kernel}${i}"
    return tm.emit_assembly(mod).encode(), False


def keep_only(mod: llvm.ModuleRef, tm: llvm.TargetMachine, kept: Sequence[str]) -> llvm.PassBuilder:
    """Every function and global of `mod` but `kept` made internal, and those none of `kept` uses
    dropped; returns the O3 pass builder it used."""
    for v in [*mod.functions, *mod.global_variables]:
        if not v.is_declaration and v.name not in kept and not v.name.startswith("llvm."):  # (not `llvm.used`)
            v.linkage = llvm.Linkage.internal
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    unused = llvm.create_new_module_pass_manager()
    unused.add_global_dead_code_eliminate_pass()
    unused.run(mod, pb)
    return pb


def optimise_device_module(mod: llvm.ModuleRef, tm: llvm.TargetMachine, kernels: Sequence[str]) -> None:
    """O3 on kernels linked with a device math library: everything but the kernels internal, and
    the library's functions no kernel calls dropped first, before O3 looks at them (libdevice: O3
    on the encoder layer's kernels 0.41 -> 0.28 s, the same PTX)."""
    pb = keep_only(mod, tm, kernels)
    pb.getModulePassManager().run(mod, pb)


def codegen_level(mod: llvm.ModuleRef) -> int:
    """3 for code LLVM optimises; 0 (the quick instruction selection and register allocation) for
    a module whose functions are all left unoptimised (`optnone`: straight-line host code),
    which level 3 would otherwise schedule and allocate registers for at length all the same
    (the encoder layer's host code: 40 -> 20 ms)."""
    defined = [fn for fn in mod.functions if not fn.is_declaration]
    return 0 if defined and all(any(b"optnone" in a for a in fn.attributes) for fn in defined) else 3


_DEFINE = re.compile(r'^define [^@]*@"?([^"(]+)"?\(', re.M)
# what a part may refer to outside a function's body: a global or function (quoted name or not), an
# attribute group, a metadata node; string literals are matched whole, so that nothing inside counts
_REFERENCE = re.compile(r'@"([^"]*)"|@([-\w.$]+)|#(\d+)\b|!(\d+)\b|c?"(?:[^"\\]|\\.)*"')
_ITEM = re.compile(r'(?:@"?([^" =]+)"? = |(?:declare|define) [^@]*@"?([^"(]+)"?\(|attributes #(\d+) = |!(\d+) = |(![-\w.]+) = )')
KERNEL_STEM = "__disc_k_"
_LOCAL = re.compile(r'(?:@"?[^" =]+"? = |define )(?:private|internal) ')  # a local global or function


class Functions:
    """A module's text cut once at its (not local) function definitions: `text(elsewhere)` is the
    module with those functions declared instead of defined, for the host code's part of a split
    compilation, at the cost of a join; `kernel(name)` is one function with only what it refers to,
    named by its structure."""

    def __init__(self, llvm_ir: str) -> None:
        self.pieces: list[tuple[str | None, str, str]] = []  # (function or None, its text, its declaration)
        self.definitions: dict[str, str] = {}  # (not local) function -> its definition
        done = 0
        for m in _DEFINE.finditer(llvm_ir):
            header_end = llvm_ir.index("\n", m.start())
            header = llvm_ir[m.start():header_end]
            if re.match(r"define (private|internal) ", header):
                continue
            end = llvm_ir.index("\n}\n", header_end) + 3
            declaration = "declare" + header.removeprefix("define").rstrip().removesuffix("{") + "\n"
            self.pieces += [(None, llvm_ir[done:m.start()], ""), (m.group(1), llvm_ir[m.start():end], declaration)]
            self.definitions[m.group(1)] = llvm_ir[m.start():end]
            done = end
        self.pieces.append((None, llvm_ir[done:], ""))

    def text(self, elsewhere: frozenset[str]) -> str:
        return "".join(declaration if name in elsewhere else text for name, text, declaration in self.pieces)

    @functools.cached_property
    def _items(self) -> tuple[dict[str, str], list[str], set[str]]:
        """What a function may refer to, by reference ("@name", "#N", "!N"): global definitions,
        declarations (of the module's defined functions too), local function definitions,
        attribute groups and metadata nodes; the named metadata (`!llvm.module.flags`); and the
        private or internal globals and functions among them."""
        items: dict[str, str] = {}
        named: list[str] = []
        for name, text, declaration in self.pieces:
            if name is not None:
                items[f"@{name}"] = declaration.rstrip("\n")
                continue
            lines, i = text.split("\n"), 0
            while i < len(lines):
                end = lines.index("}", i) if lines[i].startswith("define ") else i  # a local function: to its last line
                statement, i = "\n".join(lines[i:end + 1]), end + 1
                m = _ITEM.match(statement)
                if m is None:
                    continue  # comments, the module's name
                glob, function, group, node, named_node = m.groups()
                if named_node:
                    named.append(statement)
                else:
                    items[f"@{glob or function}" if glob or function else f"#{group}" if group else f"!{node}"] = statement
        return items, named, {ref for ref, statement in items.items() if _LOCAL.match(statement)}

    def kernel(self, name: str) -> tuple[str, str]:
        """(symbol, text): the function `name` alone, with what it refers to (transitively: globals,
        declarations, local functions, attribute groups, metadata), its attribute groups and
        metadata numbered in the order they appear, its private and internal globals and functions
        named `<symbol>$<n>` in that order, and itself named `__disc_k_<digest of that text>`: a kernel of
        the same structure has the same symbol and text in any module."""
        items, named, local = self._items
        body = self.definitions[name].rstrip("\n")
        found: dict[str, str] = {}
        todo = [body, *named]
        while todo:
            for m in _REFERENCE.finditer(todo.pop()):
                quoted, plain, group, node = m.groups()
                ref = f"@{quoted or plain}" if quoted or plain else f"#{group}" if group else f"!{node}" if node else None
                if ref is not None and ref != f"@{name}" and ref not in found and ref in items:
                    found[ref] = items[ref]
                    todo.append(items[ref])
        refs = [found[r] for r in found if r[0] == "@"]
        groups = [found[r] for r in sorted((r for r in found if r[0] == "#"), key=lambda r: int(r[1:]))]
        nodes = [found[r] for r in sorted((r for r in found if r[0] == "!"), key=lambda r: int(r[1:]))]
        text = "\n".join([*refs, body, *groups, *named, *nodes]) + "\n"
        numbers: dict[str, str] = {}

        def canonical(m: re.Match) -> str:
            quoted, plain, group, node = m.groups()
            if (quoted or plain) == name:
                return f"@{KERNEL_STEM}"
            if f"@{quoted or plain}" in local:  # its own globals and functions (a GPU kernel's shared memory is named after it)
                return numbers.setdefault(f"@{quoted or plain}", f"@{KERNEL_STEM}${sum(k[0] == '@' for k in numbers)}")
            if group or node:
                key = f"#{group}" if group else f"!{node}"
                return numbers.setdefault(key, f"{key[0]}{sum(k[0] == key[0] for k in numbers)}")
            return m.group(0)
        text = _REFERENCE.sub(canonical, text)
        symbol = KERNEL_STEM + hashlib.sha256(text.encode()).hexdigest()[:24]
        return symbol, re.sub(rf"@{KERNEL_STEM}(?=\$\d|(?![-\w.$]))", f"@{symbol}", text)


class _Helper:
    """The helper process: it says it is ready with one byte once llvmlite is loaded; then
    requests and replies are length-prefixed pickles on its stdin/stdout."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked child starts its own
        self.lock = threading.Lock()
        self.ready = False
        self.proc = subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.proc.poll() is None

    def is_ready(self) -> bool:
        """Whether it has loaded llvmlite (without waiting)."""
        if not self.ready and select.select([self.proc.stdout], [], [], 0)[0]:
            self.ready = self.proc.stdout.read(1) == READY
        return self.ready

    def call(self, request: tuple) -> tuple:
        data = pickle.dumps(request)
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)
        self.proc.stdin.flush()
        return pickle.loads(_read(self.proc.stdout))


def _read(stream) -> bytes:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the code generation helper exited")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the code generation helper exited")
    return data


READY = b"R"
_helper: _Helper | None = None
_helper_failed = False  # once a helper has failed, this process compiles everything itself
_helper_lock = threading.Lock()


def _wanted() -> bool:
    """Whether this process may use a helper: not disabled, none failed before, and run by a
    Python interpreter that could run one."""
    return (os.environ.get("DISC_COMPILE_HELPER", "1") != "0" and not _helper_failed
            and os.path.basename(sys.executable or "").startswith("python"))


def start_helper() -> None:
    """Starts the helper process if none is running (returns at once: it loads llvmlite while
    the caller runs the MLIR passes) and one is wanted (`_wanted`)."""
    global _helper, _helper_failed
    if not _wanted():
        return
    with _helper_lock:
        if _helper is None or not _helper.alive():
            try:
                _helper = _Helper()
            except OSError:
                _helper_failed = True


def ready_helper() -> _Helper | None:
    """The helper, when it is running and ready to take work now."""
    with _helper_lock:
        helper = _helper
    return helper if helper is not None and _wanted() and helper.alive() and helper.is_ready() else None


class KernelCache:
    """Kernel objects by key (`key`): the last MEMORY_BYTES of them in this process, and with
    `DISC_CACHE_DIR` set every one in its `kernels/` folder, each file its object's digest, whether
    it calls libmvec, and the object (one that does not match its digest is not used)."""

    MEMORY_BYTES = 64 << 20

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.memory: collections.OrderedDict[str, tuple[bytes, bool]] = collections.OrderedDict()
        self.size = 0

    @staticmethod
    def key(salt: bytes, spec: Spec, text: str) -> str:
        """`salt`: what else decides the code (the compiler's build)."""
        h = hashlib.sha256(salt)
        h.update(repr((spec, llvm.llvm_version_info)).encode() + b"\0" + text.encode())
        return h.hexdigest()[:32]

    @staticmethod
    def _path(key: str) -> str | None:
        folder = os.environ.get("DISC_CACHE_DIR")
        return os.path.join(folder, "kernels", f"{key}.o") if folder else None

    def get(self, key: str) -> tuple[bytes, bool] | None:
        with self.lock:
            if key in self.memory:
                self.memory.move_to_end(key)
                return self.memory[key]
        path = self._path(key)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if len(data) < 33 or hashlib.sha256(data[33:]).digest() != data[:32]:
            return None
        found = (data[33:], data[32] == 1)
        self._remember(key, found)
        return found

    def put(self, key: str, found: tuple[bytes, bool]) -> None:
        self._remember(key, found)
        path = self._path(key)
        if path is None:
            return
        obj, libmvec = found
        partial = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"  # renamed into place once complete
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(partial, "wb") as f:
                f.write(hashlib.sha256(obj).digest() + bytes([libmvec]) + obj)
            os.replace(partial, path)
        except OSError:
            pass  # an unwritable cache only costs the next compilation its code generation

    def _remember(self, key: str, found: tuple[bytes, bool]) -> None:
        with self.lock:
            if key not in self.memory:
                self.memory[key] = found
                self.size += len(found[0])
            while self.size > self.MEMORY_BYTES:
                _, (obj, _) = self.memory.popitem(last=False)
                self.size -= len(obj)


kernel_cache = KernelCache()


class KernelParts:
    """A module's kernels as parts named by their structure (`Functions.kernel`), and the code
    `kernel_cache` has for them; `store` gives it the code compiled for the `missing` ones."""

    def __init__(self, functions: Functions, kernels: list[str], spec: Spec, salt: bytes) -> None:
        self.symbols = {k: functions.kernel(k) for k in dict.fromkeys(kernels)}  # kernel -> (symbol, text)
        self.texts = dict(self.symbols.values())  # symbol -> text: kernels of one structure compile once
        self.keys = {symbol: KernelCache.key(salt, spec, text) for symbol, text in self.texts.items()}
        self.code = {symbol: kernel_cache.get(key) for symbol, key in self.keys.items()}
        self.missing = sorted((s for s, code in self.code.items() if code is None), key=lambda s: -len(self.texts[s]))  # the largest first

    def store(self, compiled: list[tuple[bytes, bool]]) -> None:
        for symbol, result in zip(self.missing, compiled):
            kernel_cache.put(self.keys[symbol], result)
            self.code[symbol] = result


def emit_objects(llvm_ir: str, spec: Spec, kernels: list[str], salt: bytes) -> tuple[list[bytes], bool, dict[str, str]]:
    """Object files for the module: the host code's, and one per distinct kernel structure (from
    `kernel_cache` where it has it); whether they call libmvec; and each kernel's symbol in those
    objects (`Functions.kernel`), which the link is to define the kernel's name as. `salt`: see
    `KernelCache.key`."""
    functions = Functions(llvm_ir)
    defined = [k for k in dict.fromkeys(kernels) if k in functions.definitions]
    parts = KernelParts(functions, defined, spec, salt)
    jobs = [("object", (functions.text(frozenset(defined)), spec, False))] + [("object", (parts.texts[s], spec, True)) for s in parts.missing]
    host, *compiled = compile_parts(jobs)
    parts.store(compiled)
    done = [host, *parts.code.values()]
    return [obj for obj, _ in done], any(libmvec for _, libmvec in done), {k: symbol for k, (symbol, _) in parts.symbols.items()}


def _run_part(kind: str, args: tuple) -> tuple[bytes, bool]:
    """One job of `compile_parts`: "object" (`compile_part`) or "ptx" (`ptx_part`)."""
    return compile_part(*args) if kind == "object" else ptx_part(*args)


def compile_parts(jobs: list[tuple[str, tuple]]) -> list[tuple[bytes, bool]]:
    """Each (kind, arguments) job (`_run_part`) run here, and in the helper when it is ready and
    there are several."""
    helper = ready_helper() if len(jobs) >= 2 else None
    queue = collections.deque((i, *job) for i, job in enumerate(jobs))
    done: dict[int, tuple[bytes, bool]] = {}
    rejected: list[str] = []
    if helper is None or not helper.lock.acquire(blocking=False):
        _drain(queue, done, rejected)
    else:
        try:
            feeder = threading.Thread(target=_feed, args=(helper, queue, done, rejected))
            feeder.start()
            try:
                _drain(queue, done, rejected)
            except BaseException:
                queue.clear()  # the feeder stops at its next part
                raise
            finally:
                feeder.join()
            _drain(queue, done, rejected)  # parts the helper gave back (it died)
        finally:
            helper.lock.release()
    if rejected:
        raise LLVMRejected(rejected[0])
    return [done[i] for i in range(len(jobs))]


def _drain(queue: collections.deque, done: dict, rejected: list) -> None:
    """Compiles parts here until none is left or the helper has had one rejected (`deque.popleft`
    is atomic: the helper's feeder takes from the same queue)."""
    while not rejected:
        try:
            i, kind, args = queue.popleft()
        except IndexError:
            return
        done[i] = _run_part(kind, args)


def _feed(helper: _Helper, queue: collections.deque, done: dict, rejected: list) -> None:
    """Hands the helper the next part until none is left; a part it cannot take (it died) goes
    back to the queue for this process."""
    while not rejected:
        try:
            i, kind, args = queue.popleft()
        except IndexError:
            return
        status, *result = _ask(helper, (kind, args))
        if status == "failed":
            queue.append((i, kind, args))
            return
        if status == "rejected":
            rejected.append(result[0])
        else:
            done[i] = tuple(result)


def _ask(helper: _Helper, request: tuple) -> tuple:
    global _helper_failed
    try:
        return helper.call(request)
    except (OSError, EOFError, pickle.UnpicklingError) as e:
        _helper_failed = True
        return ("failed", str(e))


def serve() -> None:
    """The helper's loop: compile each request's part until the input ends."""
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    while True:
        try:
            request = pickle.loads(_read(sys.stdin.buffer))
        except EOFError:
            return
        try:
            reply = ("ok", *_run_part(*request))
        except LLVMRejected as e:
            reply = ("rejected", str(e))
        data = pickle.dumps(reply)
        sys.stdout.buffer.write(struct.pack("<Q", len(data)) + data)
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    serve()
