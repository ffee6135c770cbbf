"""Write the C core's argument-slot tables from kernels/variants.toml.

    python gen_slots.py VARIANTS_TOML OUT_DIR C_SOURCE...

OUT_DIR/aotr_slots.h: AOTR_KERNEL_<kernel> (variants.toml's order) and
AOTR_SLOT_<argument> (every argument name, in order of first appearance),
AOTR_KERNEL_COUNT, AOTR_ARG_SLOTS. OUT_DIR/aotr_slots_tables.h (for
native/src/slots.c only): the kernel names, each slot's name and kind, and
the arguments each kernel must declare.

The build fails (exit status 1, "gen_slots: ..." on stderr) where variants.toml
and the C core disagree: an argument name with two kinds, an unknown type, an
OPTIONAL_ARGS entry that is not an argument, or an argument no C_SOURCE fills
(names no AOTR_SLOT_<argument>). An argument or a kernel the C code names
but variants.toml no longer has is an undeclared identifier at compile time.
Standard library only (tomli on Python 3.10); writes a file only when its
text changes.
"""
import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        sys.exit("gen_slots: reading variants.toml needs Python >= 3.11 or the tomli package")

# Arguments appended to these kernels after images had shipped: the library
# binds the kernels of older images without them (attention_values.c refuses the
# calls that need them). Every other argument is required.
SCORE_MODS = ("ALIBI", "stride_az", "stride_ah", "has_alibi", "softcap")
OPTIONAL_ARGS = {
    "attn_fwd": SCORE_MODS,
    "attn_bwd_dkdv": SCORE_MODS,
    "attn_bwd_dq": SCORE_MODS,
    "attn_bwd_fused": ("BIAS", "RNG_SEED", "RNG_OFFSET", "stride_bz", "stride_bh", "stride_bm",
                       "dropout_p") + SCORE_MODS,
}
KINDS = {"i32": "AOTR_ARG_I32", "fp32": "AOTR_ARG_FP32", "i64": "AOTR_ARG_I64"}
HEADER = "/* Generated from kernels/variants.toml by native/gen_slots.py: do not edit. */\n"


class SlotError(Exception):
    pass


def kind_of(kernel: str, name: str, type_: str) -> str:
    if type_.startswith("*"):
        return "AOTR_ARG_POINTER"
    if type_ not in KINDS:
        raise SlotError(f"kernel {kernel}: argument {name} has type {type_!r}; the C core "
                        f"passes pointers (*...), {', '.join(KINDS)}")
    return KINDS[type_]


def slots(variants: dict):
    """(kernel names, {argument: kind} in first-appearance order, {kernel: required})."""
    kernels = variants.get("kernels") or {}
    kinds, required, first = {}, {}, {}
    for kernel, spec in kernels.items():
        args = [(str(a[0]), str(a[1])) for a in spec.get("args", ())]
        names = [n for n, _ in args]
        for name in (kernel, *names):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise SlotError(f"kernel {kernel}: {name!r} is not a C identifier")
        for name, type_ in args:
            kind = kind_of(kernel, name, type_)
            if kinds.setdefault(name, kind) != kind:
                raise SlotError(f"argument {name} is {type_} in kernel {kernel} but {first[name][1]} in "
                                f"kernel {first[name][0]}: the C core passes one value per name")
            first.setdefault(name, (kernel, type_))
        optional = OPTIONAL_ARGS.get(kernel, ())
        stray = [n for n in optional if n not in names]
        if stray:
            raise SlotError(f"kernel {kernel} has no argument {', '.join(stray)} "
                            f"(gen_slots.py's OPTIONAL_ARGS names it)")
        required[kernel] = [n for n in names if n not in optional]
    gone = sorted(set(OPTIONAL_ARGS) - set(kernels))
    if gone:
        raise SlotError(f"gen_slots.py's OPTIONAL_ARGS names kernels variants.toml lacks: {gone}")
    return list(kernels), kinds, required


def check_filled(kinds: dict, sources) -> None:
    text = "".join(Path(s).read_text() for s in sources)
    unfilled = [n for n in kinds if not re.search(rf"\bAOTR_SLOT_{n}\b", text)]
    if unfilled:
        raise SlotError(f"no C source fills argument {', '.join(unfilled)} (names "
                        f"AOTR_SLOT_{unfilled[0]}): the C core would launch with garbage there")


def render(kernels, kinds, required):
    enum = "\n".join(f"    AOTR_KERNEL_{k}," for k in kernels)
    slot_enum = "\n".join(f"    AOTR_SLOT_{n}," for n in kinds)
    header = (f"{HEADER}#ifndef AOTR_SLOTS_GENERATED_H\n#define AOTR_SLOTS_GENERATED_H\n\n"
              f"enum {{\n{enum}\n    AOTR_KERNEL_COUNT\n}};\n\n"
              f"enum {{\n{slot_enum}\n    AOTR_ARG_SLOTS\n}};\n\n#endif\n")
    lines = [HEADER, "const char *const aotr_kernel_names[AOTR_KERNEL_COUNT] = {"]
    lines += [f'    "{k}",' for k in kernels]
    lines += ["};", "", "static const char *const slot_names[AOTR_ARG_SLOTS] = {"]
    lines += [f'    "{n}",' for n in kinds]
    lines += ["};", "", "static const aotr_arg_kind slot_kinds[AOTR_ARG_SLOTS] = {"]
    lines += [f"    {kind}," for kind in kinds.values()]
    lines += ["};", ""]
    for k in kernels:
        lines += [f"static const int required_{k}[] = {{"]
        lines += [f"    AOTR_SLOT_{n}," for n in required[k]]
        lines += ["    -1};"]
    lines += ["", "static const int *const required_slots[AOTR_KERNEL_COUNT] = {"]
    lines += [f"    required_{k}," for k in kernels]
    lines += ["};", ""]
    return header, "\n".join(lines)


def write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def main(argv) -> int:
    if len(argv) < 3:
        print("usage: gen_slots.py VARIANTS_TOML OUT_DIR C_SOURCE...", file=sys.stderr)
        return 2
    variants, out, sources = Path(argv[0]), Path(argv[1]), argv[2:]
    try:
        kernels, kinds, required = slots(tomllib.loads(variants.read_text(encoding="utf-8")))
        check_filled(kinds, sources)
    except (SlotError, tomllib.TOMLDecodeError, OSError) as e:
        print(f"gen_slots: {variants}: {e}", file=sys.stderr)
        return 1
    header, tables = render(kernels, kinds, required)
    out.mkdir(parents=True, exist_ok=True)
    write_if_changed(out / "aotr_slots.h", header)
    write_if_changed(out / "aotr_slots_tables.h", tables)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
