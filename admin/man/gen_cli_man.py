"""Write dispatch-slurm(1) from the click commands themselves, so the man page says what
`--help` says: `make man` runs it, tests/test_package.py regenerates and compares, and both
packages install the committed page (a build needs no click). Deterministic: no date, no
terminal width; click's own help records (option names, metavars, defaults)."""

import inspect
import re
import sys

import click

from dispatch_slurm import cli

SEE_ALSO = r"""
.SH EXIT STATUS
0 success; 1 a negative answer (\fBlatest\fR: nothing published, \fBceased\fR: not ceased);
2 an error, printed as one line on stderr naming what was wrong and how to fix it.
.SH FILES
.TP
.I /etc/dispatch\-slurm/site.conf
the site's settings, read by \fBenv\fR and \fBcheck\-site\fR; see \fBdispatch\-slurm\-site.conf\fR(5).
.SH SEE ALSO
\fBdispatch_env\fR(8), \fBdispatch\-slurm\-site.conf\fR(5), \fBsbatch\fR(1), \fBsrun\fR(1)
"""


def esc(text: str) -> str:
    """roff-safe text: backslashes escaped, no line starting as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"^([.'])", r"\\&\1", text, flags=re.M)


def paragraphs(doc: str | None) -> list[str]:
    """click's help text as roff paragraphs; a `\\b` paragraph keeps its lines (no fill)."""
    out = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(doc or "")):
        if para.startswith("\b"):
            out.append(".nf\n" + esc(para[1:].strip("\n")) + "\n.fi")
        elif para.strip():
            out.append(esc(" ".join(para.split())))
    return out


def options(cmd: click.Command, ctx: click.Context) -> list[str]:
    lines = []
    for p in cmd.get_params(ctx):
        rec = None if isinstance(p, click.Argument) else p.get_help_record(ctx)
        if rec is None:  # arguments: shown in the synopsis
            continue
        names, help_ = rec
        lines += [".TP", f"\\fB{esc(names)}\\fR", esc(" ".join(help_.split())) if help_ else ""]
    return [x for x in lines if x != ""]


def page(group: click.Group, version: str) -> str:
    top = click.Context(group, info_name="dispatch-slurm", **group.context_settings)
    out = [f'.TH DISPATCH\\-SLURM 1 "" "dispatch-slurm {version}" "User Commands"',
           ".SH NAME", "dispatch\\-slurm \\- " + esc(group.get_short_help_str(limit=200).rstrip(".")),
           ".SH SYNOPSIS", ".B dispatch\\-slurm",
           "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
           ".SH DESCRIPTION", *"\n.PP\n".join(paragraphs(group.help)).split("\n"),
           ".SH OPTIONS", *options(group, top), ".SH COMMANDS"]
    for name in group.list_commands(top):
        cmd = group.get_command(top, name)
        if cmd is None or cmd.hidden:
            continue
        ctx = click.Context(cmd, info_name=name, parent=top, **cmd.context_settings)
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        out += [f'.SS "{esc(name)} {esc(usage)}"', *"\n.PP\n".join(paragraphs(cmd.help)).split("\n"),
                *options(cmd, ctx)]
    return "\n".join(out) + SEE_ALSO


if __name__ == "__main__":
    from importlib.metadata import version
    sys.stdout.write(page(cli.dispatch, version("dispatch-slurm")))
