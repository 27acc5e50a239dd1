"""Documents the tests make, with known text in known places: PDFs written by fpdf2 (one text per page) or by hand
(`raw_pdf`, for page trees no writer makes), EPUB books written by ebooklib (chapters in a chosen spine order),
and the hostile ones (an encrypted PDF, a scan, a zip bomb, a book missing a chapter)."""
from __future__ import annotations

import zipfile
from pathlib import Path


def pdf_pages(path: Path, pages: list[str], password: str | None = None) -> Path:
    """A PDF with `pages[i]` as the text of page i + 1 (Helvetica, wrapped); `password`: encrypted (RC4) with it."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 5, text)
    if password is not None:
        from fpdf.enums import EncryptionMethod

        pdf.set_encryption(owner_password="owner", user_password=password, encryption_method=EncryptionMethod.RC4)
    pdf.output(str(path))
    return path


def scanned_pdf(path: Path, n_pages: int = 2) -> Path:
    """A PDF of pictures only (what a scanner writes): no text layer."""
    from fpdf import FPDF
    from PIL import Image

    pdf = FPDF()
    for i in range(n_pages):
        pdf.add_page()
        pdf.image(Image.new("L", (120, 60), 40 * i), x=10, y=10, w=120)
    pdf.output(str(path))
    return path


def raw_pdf(path: Path, objects: dict[int, str]) -> Path:
    """A PDF written by hand: object n is `objects[n]`, object 1 the catalog; a correct xref table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = {}
    for num in sorted(objects):
        offsets[num] = len(out)
        out += f"{num} 0 obj\n{objects[num]}\nendobj\n".encode("latin-1")
    start = len(out)
    size = max(objects) + 1
    out += f"xref\n0 {size}\n0000000000 65535 f \n".encode()
    for i in range(1, size):
        out += (f"{offsets[i]:010d} 00000 n \n" if i in offsets else "0000000000 65535 f \n").encode()
    out += f"trailer\n<< /Size {size} /Root 1 0 R >>\nstartxref\n{start}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return path


def text_page_objects(first: int, text: str, parent: int) -> dict[int, str]:
    """A page (object `first`), its content stream (`first` + 1) and font (`first` + 2) showing `text`."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
    return {first: f"<< /Type /Page /Parent {parent} 0 R /MediaBox [0 0 612 792] /Contents {first + 1} 0 R "
                   f"/Resources << /Font << /F1 {first + 2} 0 R >> >> >>",
            first + 1: f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream",
            first + 2: "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"}


def looping_pdf(path: Path) -> Path:
    """A page tree whose second /Pages node names the first as its kid: 2 -> 3 -> 2."""
    objects = {1: "<< /Type /Catalog /Pages 2 0 R >>",
               2: "<< /Type /Pages /Kids [4 0 R 3 0 R] /Count 2 >>",
               3: "<< /Type /Pages /Parent 2 0 R /Kids [2 0 R] /Count 1 >>",
               **text_page_objects(4, "a page before the loop", 2)}
    return raw_pdf(path, objects)


def epub_book(path: Path, chapters: list[tuple[str, str, str]], spine: list[int] | None = None,
              toc: bool = True) -> Path:
    """An EPUB of `chapters` [(file name, title, body HTML)]: the spine lists them in the order `spine` (indices;
    default: as given), the table of contents names each by its title (toc=False: none)."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("test-book")
    book.set_title("A test book")
    book.set_language("en")
    items = []
    for name, title, body in chapters:
        item = epub.EpubHtml(title=title, file_name=name, lang="en")
        item.content = f"<html><head><title>{title}</title></head><body>{body}</body></html>"
        book.add_item(item)
        items.append(item)
    order = [items[i] for i in (spine if spine is not None else range(len(items)))]
    book.toc = [epub.Link(it.file_name, it.title, it.file_name) for it in order] if toc else []
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *order]
    epub.write_epub(str(path), book)
    return path


def without_member(src: Path, dst: Path, suffix: str) -> Path:
    """A copy of the ZIP `src` without its members whose names end with `suffix` (a chapter gone missing)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if not info.filename.endswith(suffix):
                zout.writestr(info, zin.read(info.filename))
    return dst


def with_member(src: Path, dst: Path, name: str, data: bytes) -> Path:
    """A copy of the ZIP `src` with one more member `name` holding `data` (deflated)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info.filename))
        zout.writestr(name, data)
    return dst


def replaced_in_member(src: Path, dst: Path, name_suffix: str, old: bytes, new: bytes) -> Path:
    """A copy of the ZIP `src` with `old` replaced by `new` in the member whose name ends with `name_suffix`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(info, data.replace(old, new) if info.filename.endswith(name_suffix) else data)
    return dst
