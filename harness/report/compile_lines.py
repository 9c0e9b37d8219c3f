"""What a terminal shows of ``parity compile``'s rows, one line per target."""

from __future__ import annotations


def compile_seconds(part) -> str:
    """The time the target's rows took to compile, every status's (a failed compile took its time too); rows
    reused from a record took none here."""
    reused = part["reused_from"].notna() if "reused_from" in part else part["compile_s"].isna()
    text = f"{part.loc[~reused, 'compile_s'].sum():.1f} s compiling"
    return text + (f" ({int(reused.sum())} rows reused)" if reused.any() else "")


def mxu_summary(part) -> str:
    """The compile rows' MXU check in one line: dots verified, mismatches, and why any were unverified."""
    from harness.compile.mosaic_dump import MISMATCH, UNVERIFIED, VERIFIED

    check = part["mxu_check"].fillna("").astype(str)
    verified = part[check == VERIFIED]
    text = (f"{len(verified)} cases verified ({int(verified['mxu_dots'].sum())} dots, "
            f"{int(verified['mxu_passes_mosaic'].sum())} passes as modeled)")
    mismatched = int((check == MISMATCH).sum())
    unverified = check[check.str.startswith(UNVERIFIED)]
    if mismatched:
        text += f", {mismatched} MISMATCH (error rows)"
    if len(unverified):
        text += f", {len(unverified)} UNVERIFIED ({unverified.iloc[0]})"
    return text
