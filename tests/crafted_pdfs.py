"""PDFs written by hand for the tests: `pdf_file` lays out any objects as a valid file, and
`slow_pdf` is crafted for the bounded parser's tests, a small file that keeps pypdf busy.

`slow_pdf` is a page whose content stream inflates (FlateDecode) from a few KB to
`inflated_bytes` of text-showing operators that show nothing: pypdf walks every operator of
every page (about 8 s for 5 MB here) while the document's text stays empty, so its
character limit never stops it; a file of many such pages is a parse that, for all a job
can tell, never ends.
"""

from __future__ import annotations

import zlib

_FONT = b"<< /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >>"
_SHOW_NOTHING = b"BT /F1 12 Tf 10 10 Td () Tj ET\n"


def slow_pdf(pages: int = 1, inflated_bytes: int = 5_000_000) -> bytes:
    stream = zlib.compress(_SHOW_NOTHING * (inflated_bytes // len(_SHOW_NOTHING)), 9)
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
    ]
    for i in range(pages):
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources "
            + _FONT
            + f" /Contents {4 + 2 * i} 0 R >>".encode()
        )
        objects.append(
            f"<< /Length {len(stream)} /Filter /FlateDecode >>\nstream\n".encode()
            + stream
            + b"\nendstream"
        )
    return pdf_file(objects)


def pdf_file(objects: list[bytes], trailer: str = "") -> bytes:
    """The PDF holding `objects` (numbered from 1, the first the catalog) with its xref
    table, offsets computed; `trailer` adds entries to the trailer (e.g. an /Info ref)."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref_at = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R{trailer} >>\n".encode()
    out += b"startxref\n%d\n%%%%EOF\n" % xref_at
    return bytes(out)
