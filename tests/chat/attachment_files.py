"""Files for the attachment tests, made in code (no binary fixtures): images by Pillow, a HEIC by
pillow-heif, a PDF by pypdf, and hand-built PNG headers that claim huge sizes."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import ExifTags, Image

RED = (200, 30, 30)
BLUE = (20, 40, 220)


def image_bytes(
    kind: str, *, size: tuple[int, int] = (64, 48), color: tuple[int, int, int] = RED, **save: object
) -> bytes:
    """A plain image of one colour in Pillow format ``kind`` (JPEG, PNG, WEBP, HEIF)."""
    if kind == "HEIF":
        from pillow_heif import register_heif_opener

        register_heif_opener()
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=kind, **save)
    return buffer.getvalue()


def jpeg_with_gps() -> bytes:
    """A JPEG whose EXIF holds a camera make and a GPS position (Shanghai)."""
    exif = Image.Exif()
    exif[ExifTags.Base.Make] = "PhoneCam"
    exif[ExifTags.Base.Model] = "X100"
    gps = exif.get_ifd(ExifTags.IFD.GPSInfo)
    gps[ExifTags.GPS.GPSLatitudeRef] = "N"
    gps[ExifTags.GPS.GPSLatitude] = (31.0, 14.0, 0.0)
    gps[ExifTags.GPS.GPSLongitudeRef] = "E"
    gps[ExifTags.GPS.GPSLongitude] = (121.0, 28.0, 0.0)
    return image_bytes("JPEG", exif=exif)


def animated_gif() -> bytes:
    """A two-frame GIF: red, then blue."""
    frames = [Image.new("RGB", (32, 32), RED).convert("P"), Image.new("RGB", (32, 32), BLUE).convert("P")]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buffer.getvalue()


def pdf_bytes() -> bytes:
    """A one-page PDF."""
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims ``width`` × ``height`` grey pixels (a decompression bomb's
    header: the few bytes of data would inflate to the whole image)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = zlib.compress(b"\x00" * 1024, 9)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


HTML = b"<!doctype html><html><body><script>alert(document.cookie)</script></body></html>"
