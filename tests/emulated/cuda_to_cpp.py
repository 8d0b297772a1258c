#!/usr/bin/env python3
"""Rewrites a CUDA source (.cu / .cuh) into C++ that g++ compiles against the GPU emulation
(tests/emulated/emu/device.h, force-included). Only the constructs C++ cannot express change;
everything else, the kernels' bodies included, is copied byte for byte and keeps its line numbers
(the output starts with a #line directive naming the original file, so diagnostics, __FILE__ and
sanitizer reports point at src/):

  kernel<<<grid, block[, smem[, stream]]>>>(args);
      -> ::emu::launch(::emu::LaunchSite{"kernel", __FILE__, __LINE__, __PRETTY_FUNCTION__}, kernel,
                       ::emu::LaunchConfig::make(grid, block[, smem[, stream]]), args);
  extern __shared__ [__align__(N)] T name[];
      -> T* const name = ::emu::dynamic_shared<T, N>();
  __shared__ [__align__(N)] T name[d1]...[dk];   (k >= 0)
      -> T (&name)[d1]...[dk] = ::emu::static_shared<T[d1]...[dk], N>([] {});
  asm [volatile] ("opcode.mods operands;" : outputs : inputs [: clobbers]);
      -> ::emu::ptx::opcode_mods(operands in the template's order);
         (outputs bind to references, inputs are passed by value, immediates as literals;
         only the instructions listed in PTX_SUPPORTED are accepted)
  __CUDA_ARCH__ -> PRIMUS_EMU_CUDA_ARCH (900: the device code of the real sm_90 build)

Anything that looks like one of these but does not match the expected shape is an error that
names the file and line, so that a kernel edit cannot silently escape the emulation.

Usage: cuda_to_cpp.py INPUT OUTPUT
"""
import re
import sys

# PTX instructions the emulation implements (emu/device.h, namespace emu::ptx), by the name the
# rewrite calls: the opcode with its modifiers, dots replaced by underscores.
PTX_SUPPORTED = {
    "cp_async_cg_shared_global",
    "cp_async_ca_shared_global",
    "cp_async_commit_group",
    "cp_async_wait_group",
    "cp_async_wait_all",
    "ldmatrix_sync_aligned_m8n8_x1_shared_b16",
    "ldmatrix_sync_aligned_m8n8_x2_shared_b16",
    "ldmatrix_sync_aligned_m8n8_x4_shared_b16",
    "ldmatrix_sync_aligned_m8n8_x1_trans_shared_b16",
    "ldmatrix_sync_aligned_m8n8_x2_trans_shared_b16",
    "ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16",
    "mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32",
    "ex2_approx_ftz_f32",
    "ex2_approx_f32",
}


class TransformError(Exception):
    pass


def code_mask(src):
    """mask[i] is True where src[i] is code (not inside a comment, string or char literal)."""
    mask = [True] * len(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                mask[k] = False
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                mask[k] = False
            i = j
        elif c == '"' or c == "'":
            # R"delim( ... )delim" raw strings are not used in the kernels; reject them.
            if c == '"' and i > 0 and src[i - 1] == "R" and (i < 2 or not (src[i - 2].isalnum() or src[i - 2] == "_")):
                raise TransformError(f"line {line_of(src, i)}: raw string literals are not supported")
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            for k in range(i, min(j + 1, n)):
                mask[k] = False
            i = j + 1
        else:
            i += 1
    return mask


def line_of(src, pos):
    return src.count("\n", 0, pos) + 1


def find_code(src, mask, pattern, start=0):
    """Regex matches of `pattern` that start in code."""
    for m in re.finditer(pattern, src[start:]):
        if mask[start + m.start()]:
            yield start + m.start(), m


def skip_ws(src, i):
    while i < len(src) and src[i].isspace():
        i += 1
    return i


def balanced_end(src, mask, i, open_c, close_c):
    """src[i] == open_c; returns the index just past its matching close_c (brackets of all
    kinds must nest inside)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [close_c]
    j = i + 1
    while j < len(src):
        if mask[j]:
            c = src[j]
            if c in pairs:
                stack.append(pairs[c])
            elif c in ")]}":
                if c != stack[-1]:
                    raise TransformError(f"line {line_of(src, j)}: unbalanced '{c}'")
                stack.pop()
                if not stack:
                    return j + 1
        j += 1
    raise TransformError(f"line {line_of(src, i)}: no matching '{close_c}'")


def newlines(text):
    return "\n" * text.count("\n")


# ------------------------------------------------------------------------------- launch sites

KERNEL_EXPR = re.compile(r"^(::)?[A-Za-z_]\w*(::[A-Za-z_]\w*)*(<[^;{}()]*>)?$")


def rewrite_launches(src, mask, path):
    out, last = [], 0
    for pos, _ in find_code(src, mask, r"<<<"):
        if pos < last:
            continue
        # The kernel expression: an (optionally qualified) name with an optional template argument list.
        j = pos
        while j > 0 and src[j - 1] in " \t":
            j -= 1
        end_expr = j
        if j > 0 and src[j - 1] == ">":
            depth = 0
            while j > 0:
                j -= 1
                if src[j] == ">":
                    depth += 1
                elif src[j] == "<":
                    depth -= 1
                    if depth == 0:
                        break
        while j > 0 and (src[j - 1].isalnum() or src[j - 1] in "_:"):
            j -= 1
        kernel = src[j:end_expr]
        if not KERNEL_EXPR.match(kernel):
            raise TransformError(f"{path}:{line_of(src, pos)}: kernel launch of an unexpected form: "
                                 f"'{src[j:pos + 3]}' (expected name[<template args>]<<<...>>>(...);)")
        # The configuration: up to the matching >>> at bracket depth 0.
        k, depth = pos + 3, 0
        while True:
            if k >= len(src):
                raise TransformError(f"{path}:{line_of(src, pos)}: launch without '>>>'")
            if mask[k]:
                if src[k] in "([{":
                    depth += 1
                elif src[k] in ")]}":
                    depth -= 1
                elif depth == 0 and src.startswith(">>>", k):
                    break
                elif src[k] == ";":
                    raise TransformError(f"{path}:{line_of(src, pos)}: launch configuration without '>>>'")
            k += 1
        config = src[pos + 3:k]
        a = skip_ws(src, k + 3)
        if a >= len(src) or src[a] != "(":
            raise TransformError(f"{path}:{line_of(src, pos)}: expected '(' with the kernel arguments after '>>>'")
        b = balanced_end(src, mask, a, "(", ")")
        c = skip_ws(src, b)
        if c >= len(src) or src[c] != ";":
            raise TransformError(f"{path}:{line_of(src, pos)}: a kernel launch must be a statement of its own "
                                 f"(expected ';' after the arguments)")
        args = src[a + 1:b - 1]
        if not config.strip() or config.count(",") < 1:
            raise TransformError(f"{path}:{line_of(src, pos)}: launch configuration needs grid and block")
        name = re.sub(r"\s+", " ", kernel)
        call = (f'::emu::launch(::emu::LaunchSite{{"{name}", __FILE__, __LINE__, __PRETTY_FUNCTION__}}, {kernel}, '
                f'::emu::LaunchConfig::make({config})' + (f", {args}" if args.strip() else "") + ")")
        out.append(src[last:j])
        # The call keeps the statement's newlines (inside the copied config and arguments).
        out.append(call)
        out.append(newlines(src[end_expr:pos]) + newlines(src[k + 3:a]))
        last = b
    out.append(src[last:])
    return "".join(out)


# --------------------------------------------------------------------------- shared memory

SHARED_DECL = re.compile(
    r"(?P<extern>extern\s+)?__shared__\s+(__align__\s*\(\s*(?P<align>\d+)\s*\)\s+)?"
    r"(?P<type>(?:const\s+|volatile\s+)*(?:unsigned\s+|signed\s+)?[A-Za-z_][\w:]*(?:\s*<[^;{}]*?>)?)\s+"
    r"(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^;\[\]]*\]\s*)*);")


def rewrite_shared(src, mask, path):
    out, last = [], 0
    for pos, _ in find_code(src, mask, r"\b(extern\s+)?__shared__\b"):
        if pos < last:
            continue
        m = SHARED_DECL.match(src, pos)
        if not m:
            end = src.find(";", pos)
            raise TransformError(f"{path}:{line_of(src, pos)}: shared memory declaration of an unexpected form: "
                                 f"'{src[pos:end + 1]}' (expected [extern] __shared__ [__align__(N)] T name[...]; "
                                 f"with one name and no initializer)")
        align = m.group("align") or "0"
        typ, name = m.group("type").strip(), m.group("name")
        dims = re.sub(r"\s+", " ", m.group("dims").strip())
        if m.group("extern"):
            if dims != "[]":
                raise TransformError(f"{path}:{line_of(src, pos)}: extern __shared__ must be an unsized array")
            rep = f"{typ}* const {name} = ::emu::dynamic_shared<{typ}, {align}>();"
        else:
            if "[]" in dims:
                raise TransformError(f"{path}:{line_of(src, pos)}: static __shared__ arrays need their sizes")
            ref = f"(&{name}){dims}" if dims else f"&{name}"
            rep = f"{typ} {ref} = ::emu::static_shared<{typ}{dims}, {align}>([] {{}});"
        out.append(src[last:pos])
        out.append(rep + newlines(m.group(0)))
        last = m.end()
    out.append(src[last:])
    return "".join(out)


# --------------------------------------------------------------------------------- inline PTX

STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def parse_string_literals(text, where):
    """Concatenates adjacent string literals; returns (value, rest)."""
    value, i = "", 0
    text_len = len(text)
    while True:
        i = skip_ws(text, i)
        m = STRING.match(text, i)
        if not m:
            break
        value += m.group(1)
        i = m.end()
    if i == 0 and not value:
        raise TransformError(f"{where}: asm without a template string")
    return bytes(value, "utf-8").decode("unicode_escape"), text[i:text_len]


def split_top(text, sep):
    parts, depth, cur, i = [], 0, "", 0
    in_str = False
    while i < len(text):
        c = text[i]
        if in_str:
            cur += c
            if c == "\\":
                cur += text[i + 1]
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            cur += c
        elif c in "([{":
            depth += 1
            cur += c
        elif c in ")]}":
            depth -= 1
            cur += c
        elif c == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    parts.append(cur)
    return parts


OPERAND = re.compile(r'^\s*"(?P<c>[^"]*)"\s*\((?P<e>.*)\)\s*$', re.S)


def parse_operands(section, where):
    if not section.strip():
        return []
    ops = []
    for part in split_top(section, ","):
        m = OPERAND.match(part)
        if not m:
            raise TransformError(f"{where}: asm operand of an unexpected form: '{part.strip()}'")
        ops.append((m.group("c").strip(), m.group("e").strip()))
    return ops


def rewrite_one_asm(stmt_body, where):
    """stmt_body: the text between asm's parentheses."""
    template, rest = parse_string_literals(stmt_body, where)
    sections = split_top(rest, ":")
    if sections[0].strip():
        raise TransformError(f"{where}: unexpected text after the asm template: '{sections[0].strip()}'")
    outputs = parse_operands(sections[1], where) if len(sections) > 1 else []
    inputs = parse_operands(sections[2], where) if len(sections) > 2 else []
    if len(sections) > 4:
        raise TransformError(f"{where}: asm goto / labels are not supported")
    for c, _ in outputs:
        if not (c.startswith("=") or c.startswith("+")):
            raise TransformError(f"{where}: output operand constraint '{c}' must start with '=' or '+'")
        if c.lstrip("=+") not in ("r", "l", "f", "d", "h"):
            raise TransformError(f"{where}: unsupported output constraint '{c}'")
    for c, _ in inputs:
        if c not in ("r", "l", "f", "d", "h", "n"):
            raise TransformError(f"{where}: unsupported input constraint '{c}'")
    operands = [e for _, e in outputs] + [e for _, e in inputs]
    # In-out ("+") outputs are also inputs: PTX templates name them by their output number.
    instr = template.strip()
    if instr.startswith("{") and instr.endswith("}"):
        instr = instr[1:-1].strip()
    if instr.count(";") != 1 or not instr.endswith(";"):
        raise TransformError(f"{where}: the emulation rewrites single PTX instructions; got '{template.strip()}'")
    instr = instr[:-1].strip()
    m = re.match(r"^([a-z][\w.]*)\s*(.*)$", instr, re.S)
    if not m:
        raise TransformError(f"{where}: cannot parse PTX instruction '{instr}'")
    opcode, args_text = m.group(1), m.group(2)
    name = opcode.replace(".", "_")
    if name not in PTX_SUPPORTED:
        raise TransformError(f"{where}: PTX instruction '{opcode}' is not emulated (add it to "
                             f"tests/emulated/emu/device.h and PTX_SUPPORTED in {sys.argv[0]})")
    call_args = []
    for tok in re.findall(r"\{[^}]*\}|\[[^\]]*\]|[^,\s][^,]*", args_text):
        tok = tok.strip()
        inner = tok[1:-1] if tok[0] in "{[" else tok
        for piece in inner.split(","):
            piece = piece.strip()
            pm = re.fullmatch(r"%(\d+)", piece)
            if pm:
                k = int(pm.group(1))
                if k >= len(operands):
                    raise TransformError(f"{where}: PTX operand %{k} has no asm operand")
                call_args.append(f"({operands[k]})")
            elif re.fullmatch(r"-?\d+", piece):
                call_args.append(piece)
            else:
                raise TransformError(f"{where}: unsupported PTX operand '{piece}' in '{instr}'")
    return f"::emu::ptx::{name}({', '.join(call_args)})"


def rewrite_asm(src, mask, path):
    out, last = [], 0
    for pos, m in find_code(src, mask, r"\b(asm|__asm__|__asm)\b"):
        if pos < last:
            continue
        i = skip_ws(src, m.end())
        for qual in ("volatile", "__volatile__"):
            if src.startswith(qual, i):
                i = skip_ws(src, i + len(qual))
        if i >= len(src) or src[i] != "(":
            raise TransformError(f"{path}:{line_of(src, pos)}: asm statement of an unexpected form")
        end = balanced_end(src, mask, i, "(", ")")
        where = f"{path}:{line_of(src, pos)}"
        call = rewrite_one_asm(src[i + 1:end - 1], where)
        out.append(src[last:pos])
        out.append(call + newlines(src[pos:end]))
        last = end
    out.append(src[last:])
    return "".join(out)


def rewrite_cuda_arch(src, mask):
    out, last = [], 0
    for pos, m in find_code(src, mask, r"\b__CUDA_ARCH__\b"):
        out.append(src[last:pos])
        out.append("PRIMUS_EMU_CUDA_ARCH")
        last = m.end()
    out.append(src[last:])
    return "".join(out)


# ------------------------------------------------------------------------------------ driver

def transform(src, path):
    for forbidden in (r"\bcudaLaunchKernel\w*", r"\bcudaLaunchCooperativeKernel\w*", r"\b__CUDACC__\b",
                      r"\bcudaLaunchKernelEx\b"):
        mask = code_mask(src)
        for pos, m in find_code(src, mask, forbidden):
            raise TransformError(f"{path}:{line_of(src, pos)}: '{m.group(0)}' is not supported by the GPU emulation")
    n_launch = sum(1 for _ in find_code(src, code_mask(src), r"<<<"))
    src = rewrite_launches(src, code_mask(src), path)
    src = rewrite_shared(src, code_mask(src), path)
    src = rewrite_asm(src, code_mask(src), path)
    src = rewrite_cuda_arch(src, code_mask(src))
    mask = code_mask(src)
    for pat, what in ((r"<<<|>>>", "kernel launch"), (r"\b__shared__\b", "__shared__ declaration"),
                      (r"\b(asm|__asm__)\b", "asm statement")):
        for pos, _ in find_code(src, mask, pat):
            raise TransformError(f"{path}:{line_of(src, pos)}: a {what} was left untransformed")
    n_emu = src.count("::emu::launch(")
    if n_emu != n_launch:
        raise TransformError(f"{path}: {n_launch} launch sites but {n_emu} rewritten")
    return src


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    inp, outp = sys.argv[1], sys.argv[2]
    with open(inp, encoding="utf-8") as f:
        src = f.read()
    try:
        result = transform(src, inp)
    except TransformError as e:
        print(f"cuda_to_cpp.py: error: {e}", file=sys.stderr)
        return 1
    if result.count("\n") != src.count("\n"):
        print(f"cuda_to_cpp.py: error: {inp}: the rewrite changed the line count (internal error)", file=sys.stderr)
        return 1
    header = f'#line 1 "{inp}"\n'
    with open(outp, "w", encoding="utf-8") as f:
        f.write(header + result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
