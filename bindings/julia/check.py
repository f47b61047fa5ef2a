"""Checks FP8AMP.jl's generated ccall layer against the C header, without Julia (ctest julia.wrappers).

    python3 bindings/julia/check.py [--lib BUILD/libfp8amp.so] [--self-test]

1. Stale: generate.py is run again and its output must equal the committed src/libfp8amp_api.jl.
2. Independently of generate.py, the Julia text is parsed here (its own small parser of `const`,
   `struct` and `function ... ccall(...) end`) and compared with the header as cffi's parser models it
   (bindings/python/build_ffi.py's cdef of fp8amp.h): every header function has a wrapper of the same
   name whose ccall names that symbol, passes every parameter in order, and declares each argument
   type and the return type as the C type's Julia equivalent (aliases resolved: a handle is
   Ptr{<its struct>}, an enum stays nominal); no wrapper calls a function the header lacks; with
   --lib, every fp8amp_* symbol the library exports has a wrapper.
3. A C program generated here is compiled against the header and prints every struct's sizeof and
   every field's offsetof, every enum's size and signedness, every enumerator's and integer macro's
   value. The Julia structs must have the header's fields in order with the equivalent types, and the
   layout Julia gives an isbits struct (each field at its alignment, the size rounded up to the
   largest; the C rule) must reproduce those offsets and sizes; each enum alias must be the integer
   type of the C enum's size and signedness, each enumerator and macro constant the C value.
4. The hand-written FP8AMP.jl and test/runtests.jl call only generated fp8amp_* functions, with their
   argument counts, and use only defined FP8AMP_* names; with tree-sitter-julia installed (pip), all
   three Julia files must parse without a syntax error.
--self-test also feeds the checks a few broken copies of the Julia file (an argument type, an
argument dropped, a return type, a field type, an enumerator value, a struct field order, a stale
file) and fails unless each one is caught. Exit 0 when everything holds, 1 otherwise.

What this cannot check is anything Julia itself does: the Julia code has never been run.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
API = os.path.join(HERE, "src", "libfp8amp_api.jl")
sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
sys.path.insert(0, HERE)

try:
    import build_ffi  # noqa: E402  (the Python binding's cdef of the header)
    import cffi  # noqa: E402
    import pycparser  # noqa: E402,F401  (generate.py's parser; cffi brings it)
    from cffi import model  # noqa: E402
except ImportError as e:
    print("SKIPPED: check.py needs cffi (and its pycparser): %s" % e)
    sys.exit(77)

# C primitive -> Julia, written out again here (not imported from generate.py).
PRIM = {"int32_t": "Int32", "uint32_t": "UInt32", "int64_t": "Int64", "uint64_t": "UInt64", "size_t": "Csize_t",
        "float": "Cfloat", "double": "Cdouble", "char": "Cchar", "int": "Cint", "unsigned int": "Cuint"}
# Size and alignment of Julia's primitive types on a 64-bit host (x86-64, aarch64: the platforms the
# library builds for).
JL_LAYOUT = {"Int32": (4, 4), "UInt32": (4, 4), "Int64": (8, 8), "UInt64": (8, 8), "Csize_t": (8, 8),
             "Cfloat": (4, 4), "Cdouble": (8, 8), "Cchar": (1, 1), "Cint": (4, 4), "Cuint": (4, 4),
             "Cstring": (8, 8)}


# ---- the header, as cffi models it -------------------------------------------------------------

class Header:
    def __init__(self, include_dirs):
        incs = [os.path.join(REPO, "capi", "include")] + list(include_dirs)
        self.include_dirs = incs
        text = build_ffi.read_header(incs, "fp8amp/fp8amp.h")
        cdef = build_ffi.cdef_from_header(text, lambda n: build_ffi.read_header(incs, n))
        ffi = cffi.FFI()
        ffi.cdef(cdef)
        decls = ffi._parser._declarations  # cffi's parsed model: {"function f": (type, quals), ...}
        self.functions = {k.split(" ", 1)[1]: v[0] for k, v in decls.items() if k.startswith("function ")}
        self.macros = sorted(k.split(" ", 1)[1] for k in decls if k.startswith("macro "))
        self.enums, self.structs, self.opaque = {}, {}, set()
        for k, (tp, _) in decls.items():
            if isinstance(tp, model.EnumType):
                self.enums[tp.name] = list(zip(tp.enumerators, tp.enumvalues))
            elif isinstance(tp, model.StructType):
                if tp.fldnames is None:
                    self.opaque.add(tp.name)
                else:
                    self.structs[tp.name] = list(zip(tp.fldnames, tp.fldtypes))
            elif isinstance(tp, model.PointerType) and isinstance(tp.totype, model.StructType) \
                    and tp.totype.fldnames is None:
                self.opaque.add(tp.totype.name)

    def julia(self, tp, returned=False):
        """The Julia spelling of a cffi type: the canonical form wrappers are compared in."""
        if isinstance(tp, model.VoidType):
            return "Cvoid"
        if isinstance(tp, model.PrimitiveType):
            if tp.name not in PRIM:
                raise KeyError("no Julia type for C %s" % tp.name)
            return PRIM[tp.name]
        if isinstance(tp, (model.EnumType, model.StructType)):
            return tp.name
        if isinstance(tp, (model.FunctionPtrType, model.RawFunctionType)):
            return "Ptr{Cvoid}"
        if isinstance(tp, model.PointerType):
            if returned and isinstance(tp.totype, model.PrimitiveType) and tp.totype.name == "char":
                return "Cstring"
            return "Ptr{%s}" % self.julia(tp.totype)
        if isinstance(tp, model.ArrayType):
            return "NTuple{%d,%s}" % (tp.length, self.julia(tp.item))
        raise KeyError("no Julia type for %r" % tp)


def c_facts(header):
    """Compiles and runs a C program that prints the header's layouts and values."""
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <fp8amp/fp8amp.h>", "int main(void) {"]
    for s, fields in header.structs.items():
        lines.append('    printf("size %s %%zu\\n", sizeof(struct %s));' % (s, s))
        for f, _ in fields:
            lines.append('    printf("offset %s.%s %%zu\\n", offsetof(struct %s, %s));' % (s, f, s, f))
    for e, values in header.enums.items():
        lines.append('    printf("enum %s %%zu %%d\\n", sizeof(enum %s), (int)((enum %s)-1 < 0));' % (e, e, e))
        for name, _ in values:
            lines.append('    printf("value %s %%lld\\n", (long long)(%s));' % (name, name))
    for m in header.macros:
        lines.append('    printf("value %s %%lld\\n", (long long)(%s));' % (m, m))
    lines += ["    return 0;", "}"]
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "facts.c"), os.path.join(tmp, "facts")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        cmd = [os.environ.get("CC", "cc"), "-std=c99", "-Wall", "-Werror", src, "-o", exe]
        for d in header.include_dirs:
            cmd[1:1] = ["-I", d]
        subprocess.run(cmd, check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    facts = {}
    for ln in out.splitlines():
        kind, key, *vals = ln.split()
        facts[(kind, key)] = tuple(int(v) for v in vals)
    return facts


# ---- the Julia file, parsed here ----------------------------------------------------------------

def _split_top(s):
    """Splits s at commas outside (), {} and []."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _balanced(s, start):
    """The text inside the parenthesis that opens at s[start], and the index after its close."""
    assert s[start] == "("
    depth = 0
    for i in range(start, len(s)):
        if s[i] == "(":
            depth += 1
        elif s[i] == ")":
            depth -= 1
            if depth == 0:
                return s[start + 1:i], i + 1
    raise ValueError("unbalanced parentheses")


class Julia:
    def __init__(self, text):
        self.consts, self.structs, self.opaque, self.functions, self.errors = {}, {}, set(), {}, []
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            ln = lines[i].strip()
            i += 1
            if not ln or ln.startswith("#"):
                continue
            m = re.fullmatch(r"const (\w+) = (.+)", ln)
            if m:
                self.consts[m.group(1)] = m.group(2).strip()
                continue
            m = re.fullmatch(r"mutable struct (\w+) end", ln)
            if m:
                self.opaque.add(m.group(1))
                continue
            m = re.fullmatch(r"struct (\w+)", ln)
            if m:
                fields = []
                while lines[i].strip() != "end":
                    fm = re.fullmatch(r"(\w+)::(.+)", lines[i].strip())
                    if not fm:
                        self.errors.append("struct %s: a line that is not a field: %r" % (m.group(1), lines[i]))
                    else:
                        fields.append((fm.group(1), fm.group(2).replace(" ", "")))
                    i += 1
                i += 1
                self.structs[m.group(1)] = fields
                continue
            m = re.fullmatch(r"function (\w+)\((.*)\)", ln)
            if m:
                body = []
                while lines[i].strip() != "end":
                    body.append(lines[i].strip())
                    i += 1
                i += 1
                self._function(m.group(1), _split_top(m.group(2)), " ".join(body))
                continue
            self.errors.append("a line this parser does not know: %r" % ln)

    def _function(self, name, params, body):
        m = re.fullmatch(r"ccall(\(.*\))", body)
        if not m:
            self.errors.append("%s: the body is not one ccall: %r" % (name, body))
            return
        inner, end = _balanced(body, len("ccall"))
        if body[end:].strip():
            self.errors.append("%s: text after the ccall" % name)
        args = _split_top(inner)
        if len(args) < 3:
            self.errors.append("%s: a ccall of fewer than 3 arguments" % name)
            return
        target = re.fullmatch(r"\(:(\w+),\s*libfp8amp\)", args[0])
        types = args[2]
        if not (types.startswith("(") and types.endswith(")")):
            self.errors.append("%s: the argument types are not a tuple: %s" % (name, types))
            return
        self.functions[name] = {
            "params": params,
            "symbol": target.group(1) if target else None,
            "ret": args[1].replace(" ", ""),
            "types": [t.replace(" ", "") for t in _split_top(types[1:-1])],
            "passed": args[3:],
        }

    def resolve(self, t, nominal):
        """t with every alias replaced by its definition, except the names in `nominal` (enums)."""
        def sub(m):
            name = m.group(0)
            if name in nominal or name not in self.consts:
                return name
            value = self.consts[name].replace(" ", "")
            if not re.fullmatch(r"[\w{},]+", value) or re.fullmatch(r"-?\d+", value):
                return name  # a value constant, not a type alias
            return self.resolve(value, nominal)
        return re.sub(r"\b[A-Za-z_]\w*\b", sub, t)


# ---- the checks -----------------------------------------------------------------------------------

def problems(text, header, facts, exported=None):
    jl = Julia(text)
    out = list(jl.errors)
    enums = set(header.enums)

    # Functions.
    for name, tp in header.functions.items():
        w = jl.functions.get(name)
        if w is None:
            out.append("function %s: no wrapper" % name)
            continue
        if w["symbol"] != name:
            out.append("function %s: its ccall calls %s" % (name, w["symbol"]))
        cargs = list(tp.args)
        if len(w["types"]) != len(cargs) or len(w["params"]) != len(cargs):
            out.append("function %s: %d C parameters, the wrapper has %d parameters and %d ccall types"
                       % (name, len(cargs), len(w["params"]), len(w["types"])))
            continue
        if w["passed"] != w["params"]:
            out.append("function %s: passes %s, its parameters are %s" % (name, w["passed"], w["params"]))
        for k, (ct, jt) in enumerate(zip(cargs, w["types"])):
            want = header.julia(ct)
            if jl.resolve(jt, enums) != want:
                out.append("function %s: argument %d is %s in Julia (%s), %s in C"
                           % (name, k + 1, jt, jl.resolve(jt, enums), want))
        want = header.julia(tp.result, returned=True)
        if jl.resolve(w["ret"], enums) != want:
            out.append("function %s: returns %s in Julia, %s in C" % (name, w["ret"], want))
    for name in jl.functions:
        if name not in header.functions:
            out.append("function %s: wrapped, but the header has no such function" % name)
    for sym in exported or ():
        if sym not in jl.functions:
            out.append("symbol %s: exported by the library, no wrapper" % sym)

    # Enums: the alias is the C enum's integer type; each enumerator is its value.
    for e, values in header.enums.items():
        size, signed = facts[("enum", e)]
        want = {(4, 1): "Int32", (4, 0): "UInt32", (8, 1): "Int64", (8, 0): "UInt64"}[(size, signed)]
        if jl.consts.get(e) != want:
            out.append("enum %s: Julia alias %s, C's enum is %s" % (e, jl.consts.get(e), want))
        for n, v in values:
            c_value = facts[("value", n)][0]
            if c_value != v:
                out.append("enumerator %s: cffi reads %d, the compiler %d" % (n, v, c_value))
            if jl.consts.get(n) != "%s(%d)" % (e, c_value):
                out.append("enumerator %s: Julia %s, C %s(%d)" % (n, jl.consts.get(n), e, c_value))
    for mname in header.macros:
        c_value = facts[("value", mname)][0]
        if jl.consts.get(mname) != str(c_value):
            out.append("macro %s: Julia %s, C %d" % (mname, jl.consts.get(mname), c_value))

    # Opaque structs and handle aliases.
    for s in header.opaque:
        if s not in jl.opaque:
            out.append("struct %s: opaque in C, no `mutable struct %s end` in Julia" % (s, s))

    # Structs: fields, types, layout.
    def layout(t):
        t = jl.resolve(t, set())  # enums to their integer type
        if t in JL_LAYOUT:
            return JL_LAYOUT[t]
        if t.startswith("Ptr{"):
            return 8, 8
        m = re.fullmatch(r"NTuple\{(\d+),(.+)\}", t)
        if m:
            size, align = layout(m.group(2))
            return int(m.group(1)) * size, align
        if t in jl.structs:
            return struct_layout(t)[:2]
        raise KeyError("no layout for Julia type %s" % t)

    def struct_layout(s):
        off, align, offsets = 0, 1, []
        for _, ft in jl.structs[s]:
            size, a = layout(ft)
            off = (off + a - 1) // a * a
            offsets.append(off)
            off += size
            align = max(align, a)
        return (off + align - 1) // align * align, align, offsets

    for s, fields in header.structs.items():
        if s not in jl.structs:
            out.append("struct %s: not in Julia" % s)
            continue
        jf = jl.structs[s]
        if [f for f, _ in jf] != [f for f, _ in fields]:
            out.append("struct %s: Julia fields %s, C fields %s" % (s, [f for f, _ in jf], [f for f, _ in fields]))
            continue
        for (f, ct), (_, jt) in zip(fields, jf):
            if jl.resolve(jt, enums) != header.julia(ct):
                out.append("struct %s: field %s is %s in Julia, %s in C" % (s, f, jt, header.julia(ct)))
        try:
            size, _, offsets = struct_layout(s)
        except KeyError as e:
            out.append("struct %s: %s" % (s, e))
            continue
        if size != facts[("size", s)][0]:
            out.append("struct %s: Julia size %d, C sizeof %d" % (s, size, facts[("size", s)][0]))
        for (f, _), o in zip(fields, offsets):
            if o != facts[("offset", "%s.%s" % (s, f))][0]:
                out.append("struct %s: field %s at %d in Julia, offsetof %d in C"
                           % (s, f, o, facts[("offset", "%s.%s" % (s, f))][0]))
    for s in jl.structs:
        if s not in header.structs:
            out.append("struct %s: in Julia, not in the header" % s)
    return out, jl


def handwritten_problems(text, jl):
    """FP8AMP.jl (hand-written, never run) against the generated layer: every fp8amp_* it calls is a
    wrapper called with its number of arguments, a struct constructed with all its fields, or an
    alias converting one value; every FP8AMP_* name it uses is defined."""
    out = []
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', re.sub(r"#.*", "", text))  # no comments, strings
    for m in re.finditer(r"\b(fp8amp_\w+)\(", code):
        name = m.group(1)
        args = _split_top(_balanced(code, m.end() - 1)[0])
        if name in jl.functions:
            want = len(jl.functions[name]["params"])
        elif name in jl.structs:
            want = len(jl.structs[name])
        elif name in jl.consts:
            want = 1
        else:
            out.append("FP8AMP.jl calls %s, which the generated layer does not define" % name)
            continue
        if len(args) != want:
            out.append("FP8AMP.jl calls %s with %d arguments, it takes %d" % (name, len(args), want))
    for name in sorted(set(re.findall(r"\b(?:FP8AMP_[A-Z0-9_]+|fp8amp_\w+)\b", code))):
        if name not in jl.consts and name not in jl.functions and name not in jl.structs and name not in jl.opaque:
            out.append("FP8AMP.jl uses %s, which the generated layer does not define" % name)
    return out


def syntax_problems(paths):
    """Julia syntax errors found by tree-sitter's Julia grammar (pip: tree-sitter, tree-sitter-julia),
    or None when it is not installed. A parser, not Julia: it proves the files parse, nothing more."""
    try:
        import tree_sitter
        import tree_sitter_julia
    except ImportError:
        return None
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_julia.language()))
    out = []
    for path in paths:
        with open(path, "rb") as f:
            tree = parser.parse(f.read())
        stack = [tree.root_node]
        while stack:
            n = stack.pop()
            if n.type == "ERROR" or n.is_missing:
                out.append("%s:%d:%d: Julia syntax error (tree-sitter: %s)"
                           % (os.path.relpath(path, REPO), n.start_point[0] + 1, n.start_point[1] + 1,
                              "missing " + n.type if n.is_missing else "unexpected text"))
                break
            stack.extend(n.children)
    return out


def exported_symbols(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
    return sorted({ln.split()[-1].split("@")[0] for ln in out.splitlines()
                   if ln.split() and ln.split()[-1].startswith("fp8amp_")})


def self_test(text, header, facts):
    """Each mutation must be caught; returns the ones that were not."""
    def once(pattern, repl):
        def f(t):
            new, n = re.subn(pattern, repl, t, count=1, flags=re.M)
            assert n == 1, pattern
            return new
        return f
    mutations = {
        "argument type": once(r"\(fp8amp_tensor, Ptr\{Cvoid\}, Csize_t\)", "(fp8amp_tensor, Ptr{Cvoid}, UInt32)"),
        "argument dropped": once(r"(ccall\(\(:fp8amp_quantize, libfp8amp\), fp8amp_status, \(fp8amp_context, fp8amp_tensor), fp8amp_tensor\)",
                                 r"\1)"),
        "handle kind": once(r"\(fp8amp_context, Ptr\{fp8amp_recipe\}, fp8amp_dtype, Ptr\{fp8amp_scaling\}\)",
                            "(fp8amp_context, Ptr{fp8amp_recipe}, fp8amp_dtype, Ptr{fp8amp_tensor})"),
        "enum kind": once(r"Csize_t, \(fp8amp_dtype,\), dtype\)", "Csize_t, (fp8amp_format,), dtype)"),
        "return type": once(r"\(:fp8amp_version, libfp8amp\), UInt32", "(:fp8amp_version, libfp8amp), Int32"),
        "symbol": once(r"\(:fp8amp_cast, libfp8amp\)", "(:fp8amp_amax, libfp8amp)"),
        "field type": once(r"^    margin::Int32$", "    margin::Int64"),
        "field order": once(r"^    in_features::Int64\n    out_features::Int64$", "    out_features::Int64\n    in_features::Int64"),
        "enumerator value": once(r"^const FP8AMP_DTYPE_E5M2 = fp8amp_dtype\(4\)$", "const FP8AMP_DTYPE_E5M2 = fp8amp_dtype(5)"),
        "enum signedness": once(r"^const fp8amp_status = UInt32$", "const fp8amp_status = Int64"),
        "macro value": once(r"^const FP8AMP_MAX_NDIM = 8$", "const FP8AMP_MAX_NDIM = 9"),
        "function dropped": once(r"^function fp8amp_amax\(ctx, t, amax\)\n.*\nend\n", ""),
    }
    missed = []
    for what, mutate in mutations.items():
        found, _ = problems(mutate(text), header, facts)
        print("  self-test: %-17s %s" % (what, "caught: " + found[0] if found else "NOT CAUGHT"))
        if not found:
            missed.append(what)
    return missed


def main(argv):
    ap = argparse.ArgumentParser(description="Checks FP8AMP.jl's generated layer against fp8amp.h.")
    ap.add_argument("--include", action="append", default=[],
                    help="a folder searched after capi/include (repeatable; capi/include holds every header)")
    ap.add_argument("--lib", help="libfp8amp.so: every exported fp8amp_* symbol must have a wrapper")
    ap.add_argument("--self-test", action="store_true", help="also check that broken copies are caught")
    a = ap.parse_args(argv)

    import generate
    failures = []
    with open(API) as f:
        committed = f.read()
    fresh = generate.generate(a.include)
    if fresh != committed:
        diff = list(difflib.unified_diff(committed.splitlines(), fresh.splitlines(), "committed", "generated",
                                         lineterm="", n=1))
        failures.append("src/libfp8amp_api.jl is stale: run python3 bindings/julia/generate.py and commit it. "
                        "First differences:\n" + "\n".join(diff[:30]))
    header = Header(a.include)
    facts = c_facts(header)
    exported = exported_symbols(a.lib) if a.lib else None
    found, jl = problems(committed, header, facts, exported)
    failures += found
    hand = []
    for rel in ("src/FP8AMP.jl", "test/runtests.jl"):
        with open(os.path.join(HERE, rel)) as f:
            hand += ["%s: %s" % (rel, m) for m in handwritten_problems(f.read(), jl)]
    failures += hand
    syntax = syntax_problems([API, os.path.join(HERE, "src", "FP8AMP.jl"), os.path.join(HERE, "test", "runtests.jl")])
    if syntax is None:
        print("syntax: not checked (pip install tree-sitter tree-sitter-julia to parse the Julia files)")
    else:
        failures += syntax
        print("syntax: the three Julia files parse (tree-sitter-julia)%s" % (": %d errors" % len(syntax) if syntax else ""))
    print("FP8AMP.jl, test/runtests.jl: %s" % ("every generated name they use exists, with its argument count" if not hand
                              else "%d problems" % len(hand)))
    print("checked %d functions (ccall symbol, %d arguments, return types), %d structs (fields, types, %d offsets, "
          "sizes), %d enums (%d enumerators), %d macros, %d opaque types%s"
          % (len(header.functions), sum(len(t.args) for t in header.functions.values()), len(header.structs),
             sum(len(v) for v in header.structs.values()), len(header.enums),
             sum(len(v) for v in header.enums.values()), len(header.macros), len(header.opaque),
             "; %d exported symbols all wrapped" % len(exported) if exported is not None and not found else ""))
    if a.self_test:
        missed = self_test(committed, header, facts)
        # The stale check: a committed file that a header change has not reached.
        if fresh == committed.replace("const FP8AMP_MAX_NDIM = 8", "const FP8AMP_MAX_NDIM = 7"):
            missed.append("stale file")
        else:
            print("  self-test: %-17s caught: the regenerated file differs" % "stale file")
        failures += ["self-test: a broken copy was not caught (%s)" % m for m in missed]
    if failures:
        print("\n".join("FAIL: " + f for f in failures))
        return 1
    print("PASS (the Julia code itself has not been run: no Julia toolchain here)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
