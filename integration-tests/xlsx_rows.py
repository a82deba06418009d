"""The rows of an .xlsx's first worksheet, read with the standard library's C XML parser.

openpyxl reads a million-row export in tens of seconds; this reads it in a few. It takes what
an .xlsx may hold for plain values (numbers, inline strings, shared strings, formula strings),
so it is a reader of the format, not of our writer's habits; the suites still open each
workbook with openpyxl too, which checks the package as a spreadsheet program would.
"""

import io
import re
import zipfile
import xml.etree.ElementTree as ET

NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REF = re.compile(r"([A-Z]+)(\d+)")


def _column(ref):
    n = 0
    for ch in _REF.match(ref).group(1):
        n = n * 26 + ord(ch) - 64
    return n - 1


def _text(el):
    """A string item's text: <t>, or the runs' <r><t> joined."""
    return "".join(t.text or "" for t in el.iter(NS + "t"))


def _number(s):
    f = float(s)
    return int(f) if f.is_integer() and "." not in s and "E" not in s.upper() else f


def sheet_rows(raw):
    """Yields each row of the first worksheet as a tuple, as openpyxl's values_only would:
    numbers as int or float, strings as str, a missing cell as None; every row as wide as
    the widest before it (the header, in an export)."""
    z = zipfile.ZipFile(io.BytesIO(raw))
    shared = []
    if "xl/sharedStrings.xml" in z.namelist():
        shared = [_text(si) for si in ET.fromstring(z.read("xl/sharedStrings.xml"))
                  .iter(NS + "si")]
    width = 0
    with z.open("xl/worksheets/sheet1.xml") as f:
        for _, el in ET.iterparse(f):
            if el.tag != NS + "row":
                continue
            cells = {}
            col = -1
            for c in el.iter(NS + "c"):
                ref = c.get("r")  # optional: a cell without one is the next column
                col = _column(ref) if ref else col + 1
                kind = c.get("t")
                if kind == "inlineStr":
                    value = _text(c.find(NS + "is"))
                else:
                    v = c.find(NS + "v")
                    if v is None or v.text is None:
                        continue
                    if kind == "s":
                        value = shared[int(v.text)]
                    elif kind in ("str", "e"):
                        value = v.text
                    elif kind == "b":
                        value = v.text == "1"
                    else:
                        value = _number(v.text)
                cells[col] = value
            width = max([width] + [k + 1 for k in cells])
            yield tuple(cells.get(i) for i in range(width))
            el.clear()


def first_difference(got, want):
    """The first index where two row lists differ, with both rows (None past an end), or None
    when they are equal: one comparison instead of a check per row."""
    if got == want:
        return None
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return i, g, w
    i = min(len(got), len(want))
    return i, got[i] if i < len(got) else None, want[i] if i < len(want) else None
