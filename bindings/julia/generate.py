"""Generates bindings/julia/src/libfp8amp_api.jl, the raw `ccall` layer of FP8AMP.jl, from the public
C header: every function, enum, struct, handle type and integer macro of fp8amp.h, nothing by hand.

    python3 bindings/julia/generate.py [--include DIR ...] [-o OUT]

The headers are this tree's capi/include (fp8amp.h, version.h, dlpack.h), always searched first;
--include adds folders after it. Without -o the file
is written in place. check.py (ctest julia.wrappers) regenerates it and fails when the committed
file differs, so run this after every header change and commit the result.

How: the header is preprocessed by the C compiler (cc -E) with two stand-in system headers that
declare only the fixed-width typedefs (so that the integer types keep their names), parsed with
pycparser (which cffi brings), and walked declaration by declaration. The integer macros come
from the same preprocessor (cc -E -dM), evaluated. A declaration of a kind this script does not know
stops it, so a header change it cannot translate fails loudly instead of losing a function.

The mapping (C -> Julia):
  int32_t/uint32_t/int64_t/uint64_t -> Int32/UInt32/Int64/UInt64; size_t -> Csize_t; float/double ->
  Cfloat/Cdouble; char -> Cchar; void -> Cvoid; int -> Cint
  enum E           -> const E = UInt32 (Int32 when a value is negative: the type GCC and Clang give
                      it), and one `const NAME = E(value)` per enumerator
  struct S {...}   -> an immutable `struct S` with the same fields in order (Julia lays out an isbits
                      struct as C does); T x[n] -> NTuple{n, T}
  struct S_s *H    -> `mutable struct S_s end` (opaque) and const H = Ptr{S_s}
  function pointer -> Ptr{Cvoid}
  T *p             -> Ptr{T}; a returned const char * -> Cstring
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import pycparser
from pycparser import c_ast

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(HERE, "src", "libfp8amp_api.jl")

# The stand-in system headers: only the typedefs fp8amp.h uses, so that pycparser sees their names
# (the real glibc headers hold GNU extensions pycparser does not parse).
FAKE_STDDEF = "typedef unsigned long size_t;\n"
FAKE_STDINT = ("typedef int int32_t;\ntypedef unsigned int uint32_t;\ntypedef long int64_t;\n"
               "typedef unsigned long uint64_t;\n")

PRIMITIVES = {
    "int32_t": "Int32", "uint32_t": "UInt32", "int64_t": "Int64", "uint64_t": "UInt64", "size_t": "Csize_t",
    "float": "Cfloat", "double": "Cdouble", "char": "Cchar", "void": "Cvoid", "int": "Cint",
    "unsigned int": "Cuint",
}

JULIA_KEYWORDS = {"baremodule", "begin", "break", "catch", "const", "continue", "do", "else", "elseif", "end",
                  "export", "false", "finally", "for", "function", "global", "if", "import", "let", "local",
                  "macro", "module", "quote", "return", "struct", "true", "try", "using", "while", "abstract",
                  "mutable", "primitive", "type", "where", "in", "isa", "outer"}


class Unknown(RuntimeError):
    """A declaration this generator cannot translate."""


def preprocess(include_dirs, macros_only=False):
    with tempfile.TemporaryDirectory() as fake:
        with open(os.path.join(fake, "stddef.h"), "w") as f:
            f.write(FAKE_STDDEF)
        with open(os.path.join(fake, "stdint.h"), "w") as f:
            f.write(FAKE_STDINT)
        cmd = [os.environ.get("CC", "cc"), "-E", "-P", "-nostdinc", "-I", fake]
        for d in include_dirs:
            cmd += ["-I", d]
        if macros_only:
            cmd.append("-dM")
        cmd.append(os.path.join(REPO, "capi", "include", "fp8amp", "fp8amp.h"))
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def integer_macros(include_dirs):
    """{NAME: int} of the object-like FP8AMP_* macros whose value is an integer expression."""
    raw = {}
    for line in preprocess(include_dirs, macros_only=True).splitlines():
        m = re.match(r"#define (FP8AMP_\w+) (.+)$", line)  # no "(" right after the name: object-like
        if m:
            raw[m.group(1)] = m.group(2).strip()
    values = {}

    def value(name, depth=0):
        if name in values:
            return values[name]
        if depth > 10:
            raise Unknown("macro %s: recursion too deep" % name)
        expr = re.sub(r"\b(FP8AMP_\w+)\b", lambda m: str(value(m.group(1), depth + 1)), raw[name])
        expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", expr)
        if not re.fullmatch(r"[\d\s()+\-*]+", expr):
            raise Unknown("macro %s = %s is not an integer expression" % (name, raw[name]))
        values[name] = int(eval(expr, {"__builtins__": {}}))  # digits, + - * and parentheses only
        return values[name]

    out = {}
    for name, text in raw.items():
        if text == "":
            continue  # FP8AMP_API, include guards
        try:
            out[name] = value(name)
        except Unknown:
            continue  # not an integer (none today); left to the header
    return out


class Generator:
    def __init__(self):
        self.enums = {}        # typedef name -> Julia base type
        self.structs = {}      # tag -> fields
        self.opaque = set()    # opaque struct tags
        self.aliases = {}      # typedef name -> Julia type (handles, function pointers)
        self.lines = []

    # ---- types ---------------------------------------------------------------------------------

    def jtype(self, node, returned=False):
        if isinstance(node, c_ast.TypeDecl):
            t = node.type
            if isinstance(t, c_ast.IdentifierType):
                name = " ".join(t.names)
                if name in PRIMITIVES:
                    return PRIMITIVES[name]
                if name in self.enums or name in self.aliases or name in self.structs:
                    return name
                raise Unknown("unknown type name %s" % name)
            if isinstance(t, c_ast.Struct):
                if t.name in self.structs or t.name in self.opaque:
                    return t.name
                raise Unknown("struct %s used before its declaration" % t.name)
            raise Unknown("type %s" % type(t).__name__)
        if isinstance(node, c_ast.PtrDecl):
            inner = node.type
            if isinstance(inner, c_ast.FuncDecl):
                return "Ptr{Cvoid}"
            if (returned and isinstance(inner, c_ast.TypeDecl) and isinstance(inner.type, c_ast.IdentifierType)
                    and inner.type.names == ["char"]):
                return "Cstring"
            return "Ptr{%s}" % self.jtype(inner)
        if isinstance(node, c_ast.ArrayDecl):
            n = node.dim
            if not isinstance(n, c_ast.Constant):
                raise Unknown("array dimension that is not a literal")
            return "NTuple{%d, %s}" % (int(n.value, 0), self.jtype(node.type))
        raise Unknown("declarator %s" % type(node).__name__)

    # ---- declarations --------------------------------------------------------------------------

    def enum(self, name, e):
        values, nxt = [], 0
        for en in e.values.enumerators:
            if en.value is not None:
                v = self.const_int(en.value)
            else:
                v = nxt
            values.append((en.name, v))
            nxt = v + 1
        base = "Int32" if any(v < 0 for _, v in values) else "UInt32"
        self.enums[name] = base
        self.lines.append("# enum %s" % name)
        self.lines.append("const %s = %s" % (name, base))
        for en, v in values:
            self.lines.append("const %s = %s(%d)" % (en, name, v))
        self.lines.append("")

    @staticmethod
    def const_int(node):
        if isinstance(node, c_ast.Constant):
            return int(node.value.rstrip("uUlL"), 0)
        if isinstance(node, c_ast.UnaryOp) and node.op == "-":
            return -Generator.const_int(node.expr)
        raise Unknown("enumerator value that is not an integer literal")

    def struct(self, name, s):
        fields = []
        for d in s.decls:
            fields.append((d.name, self.jtype(d.type)))
        self.structs[name] = fields
        self.lines.append("struct %s" % name)
        for fname, ftype in fields:
            self.lines.append("    %s::%s" % (fname, ftype))
        self.lines.append("end")
        self.lines.append("")

    def typedef(self, td):
        t = td.type
        if isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.Enum):
            if t.type.values is None:
                raise Unknown("typedef of an incomplete enum %s" % td.name)
            self.enum(td.name, t.type)
        elif isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.Struct):
            st = t.type
            if st.decls is None:
                raise Unknown("typedef of an incomplete struct %s" % td.name)
            if st.name not in (None, td.name):
                raise Unknown("struct tag %s differs from its typedef %s" % (st.name, td.name))
            self.struct(td.name, st)
        elif (isinstance(t, c_ast.PtrDecl) and isinstance(t.type, c_ast.TypeDecl)
              and isinstance(t.type.type, c_ast.Struct) and t.type.type.decls is None):
            tag = t.type.type.name
            if tag not in self.opaque:
                self.opaque.add(tag)
                self.lines.append("mutable struct %s end" % tag)
            self.aliases[td.name] = "Ptr{%s}" % tag
            self.lines.append("const %s = Ptr{%s}" % (td.name, tag))
            self.lines.append("")
        elif isinstance(t, c_ast.PtrDecl) and isinstance(t.type, c_ast.FuncDecl):
            self.aliases[td.name] = "Ptr{Cvoid}"
            self.lines.append("# %s: a C function pointer (make one with @cfunction)" % td.name)
            self.lines.append("const %s = Ptr{Cvoid}" % td.name)
            self.lines.append("")
        elif isinstance(t, c_ast.TypeDecl) and isinstance(t.type, c_ast.IdentifierType) and td.name in PRIMITIVES:
            pass  # the stand-in stdint/stddef typedefs
        else:
            raise Unknown("typedef %s of a kind the generator does not know" % td.name)

    def function(self, d):
        f = d.type
        ret = self.jtype(f.type, returned=True)
        params = []
        if f.args is not None:
            for i, p in enumerate(f.args.params):
                if isinstance(p, c_ast.Typename):  # (void) or an unnamed parameter
                    if isinstance(p.type, c_ast.TypeDecl) and getattr(p.type.type, "names", None) == ["void"]:
                        continue
                    raise Unknown("%s: unnamed parameter %d" % (d.name, i))
                if isinstance(p, c_ast.EllipsisParam):
                    raise Unknown("%s: variadic" % d.name)
                pname = p.name + "_" if p.name in JULIA_KEYWORDS else p.name
                params.append((pname, self.jtype(p.type)))
        names = ", ".join(n for n, _ in params)
        types = "".join("%s, " % t for _, t in params).rstrip(" ") if len(params) == 1 else ", ".join(t for _, t in params)
        self.lines.append("function %s(%s)" % (d.name, names))
        self.lines.append("    ccall((:%s, libfp8amp), %s, (%s)%s)" % (d.name, ret, types, "".join(", " + n for n, _ in params)))
        self.lines.append("end")
        self.lines.append("")

    def run(self, ast):
        for node in ast.ext:
            if isinstance(node, c_ast.Typedef):
                self.typedef(node)
            elif isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
                self.function(node)
            elif (isinstance(node, c_ast.Decl) and node.name is None and isinstance(node.type, c_ast.Struct)
                  and node.type.decls is None):
                tag = node.type.name  # a forward declaration (struct DLManagedTensorVersioned;)
                if tag not in self.opaque:
                    self.opaque.add(tag)
                    self.lines.append("# declared, not defined, by fp8amp.h (DLPack's struct): opaque here")
                    self.lines.append("mutable struct %s end" % tag)
                    self.lines.append("")
            else:
                raise Unknown("a top-level declaration of a kind the generator does not know: %s"
                              % type(node).__name__)


def generate(include_dirs):
    incs = [os.path.join(REPO, "capi", "include")] + list(include_dirs)
    ast = pycparser.CParser().parse(preprocess(incs), filename="fp8amp.h")
    g = Generator()
    g.run(ast)
    macros = integer_macros(incs)
    head = [
        "# Generated by bindings/julia/generate.py from capi/include/fp8amp/fp8amp.h: do not edit.",
        "# Regenerate after a header change (check.py, ctest julia.wrappers, fails while this file is stale).",
        "# The raw layer: one function per C function, calling it with exactly the header's types; the",
        "# hand-written layer in FP8AMP.jl adds error checking, finalizers and Julia types.",
        "",
        "# Integer macros of the header (FP8AMP_VERSION* describe the header this file was generated from).",
    ]
    head += ["const %s = %d" % (n, v) for n, v in sorted(macros.items())]
    head.append("")
    return "\n".join(head + g.lines).rstrip("\n") + "\n"


def main(argv):
    ap = argparse.ArgumentParser(description="Generates FP8AMP.jl's ccall layer from fp8amp.h.")
    ap.add_argument("--include", action="append", default=[],
                    help="a folder searched after capi/include (repeatable; capi/include holds every header)")
    ap.add_argument("-o", "--output", default=OUT)
    a = ap.parse_args(argv)
    text = generate(a.include)
    with open(a.output, "w") as f:
        f.write(text)
    print("wrote %s (%d functions)" % (a.output, text.count("\nfunction ")), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
