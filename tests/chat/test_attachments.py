"""Attachments over HTTP (issue 33; CONTRACT.md, "Attachments"): the upload judged by content,
metadata stripped, limits, CORS, signed links that expire, and the files gone with their
conversations. Every file is made in code (tests/chat/attachment_files.py)."""

from __future__ import annotations

import asyncio
import io
import json
import time
from io import StringIO
from typing import Any

import pytest
from django.core.files.storage import storages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client
from PIL import ExifTags, Image

from chat import attachments, limits, retention, selectors, services
from chat.models import Attachment, Conversation, Message, Role
from config import body_limit
from tests.chat import attachment_files as files

pytestmark = pytest.mark.django_db

UPLOAD = "/api/chat/attachments"
STORE = "http://shop.example"


@pytest.fixture(autouse=True)
def _widget_origin(settings):
    settings.KEFU_WIDGET_ORIGINS = [STORE]


@pytest.fixture
def shopper() -> tuple[Conversation, str]:
    """A conversation and its token."""
    return services.conversation_start(locale="en")


def upload(
    conversation: Conversation | None,
    token: str | None,
    data: bytes,
    name: str,
    *,
    origin: str = STORE,
    content_type: str = "application/octet-stream",
    client: Client | None = None,
) -> Any:
    headers = {"Origin": origin}
    if conversation is not None:
        headers["X-Kefu-Conversation"] = str(conversation.pk)
    if token is not None:
        headers["X-Kefu-Token"] = token
    return (client or Client()).post(
        UPLOAD, {"file": SimpleUploadedFile(name, data, content_type=content_type)}, headers=headers
    )


def served(url: str) -> Any:
    return Client().get(url.removeprefix("http://testserver"))


def stored_bytes(attachment_id: str) -> bytes:
    row = Attachment.objects.get(pk=attachment_id)
    with storages["attachments"].open(row.file.name, "rb") as f:
        return f.read()


# --- each kind in and out ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "sent_name", "content_type", "name", "pillow_format"),
    [
        (files.image_bytes("JPEG"), "bike.jpeg", "image/jpeg", "bike.jpg", "JPEG"),
        (files.image_bytes("PNG"), "receipt.png", "image/png", "receipt.png", "PNG"),
        (files.image_bytes("WEBP"), "lamp.webp", "image/webp", "lamp.webp", "WEBP"),
        (files.animated_gif(), "spin.gif", "image/png", "spin.png", "PNG"),  # the first frame
        (files.image_bytes("HEIF"), "IMG_0042.HEIC", "image/jpeg", "IMG_0042.jpg", "JPEG"),
        (files.pdf_bytes(), "invoice.pdf", "application/pdf", "invoice.pdf", None),
    ],
)
def test_each_kind_is_taken_and_served_as_what_it_is(shopper, data, sent_name, content_type, name, pillow_format):
    conv, token = shopper
    response = upload(conv, token, data, sent_name)
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"id", "name", "content_type", "size", "url"}
    assert (body["name"], body["content_type"]) == (name, content_type)
    assert body["url"].startswith("http://testserver/api/chat/attachments/")
    assert response["Access-Control-Allow-Origin"] == STORE
    row = Attachment.objects.get(pk=body["id"])
    assert (row.conversation_id, row.role, row.message_id, row.size) == (conv.pk, Role.SHOPPER, None, body["size"])

    got = served(body["url"])
    assert got.status_code == 200
    content = b"".join(got.streaming_content)
    assert len(content) == body["size"] and got["Content-Type"] == content_type
    assert got["X-Content-Type-Options"] == "nosniff"
    assert got["Content-Security-Policy"] == "default-src 'none'; sandbox"
    assert "no-store" in got["Cache-Control"]
    if pillow_format is None:
        assert got["Content-Disposition"].startswith("attachment;") and content == data
    else:
        assert got["Content-Disposition"].startswith("inline;")
        assert Image.open(io.BytesIO(content)).format == pillow_format


def test_a_gif_is_stored_as_its_first_frame():
    judged = attachments.judge(files.animated_gif(), name="spin.gif")
    image = Image.open(io.BytesIO(judged.content))
    assert getattr(image, "n_frames", 1) == 1
    red = image.convert("RGB").getpixel((5, 5))
    assert red[0] > 150 and red[2] < 80  # the red first frame, not the blue second


def test_a_jpeg_with_gps_in_has_no_metadata_out(shopper):
    sent = files.jpeg_with_gps()
    exif_in = Image.open(io.BytesIO(sent)).getexif()
    assert exif_in[ExifTags.Base.Make] == "PhoneCam" and exif_in.get_ifd(ExifTags.IFD.GPSInfo)
    conv, token = shopper
    body = upload(conv, token, sent, "me.jpg").json()
    for out in (stored_bytes(body["id"]), b"".join(served(body["url"]).streaming_content)):
        image = Image.open(io.BytesIO(out))
        assert dict(image.getexif()) == {}
        assert "exif" not in image.info and "comment" not in image.info
        assert b"PhoneCam" not in out


# --- refused ------------------------------------------------------------------------------------


def test_html_named_png_is_unsupported(shopper):
    conv, token = shopper
    response = upload(conv, token, files.HTML, "cat.png", content_type="image/png")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_type"
    assert not Attachment.objects.exists()


def test_a_broken_pdf_is_unsupported(shopper):
    conv, token = shopper
    response = upload(conv, token, b"%PDF-1.7\nnot really", "x.pdf")
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_type"


def test_a_decompression_bomb_is_refused(shopper, settings):
    conv, token = shopper
    bomb = files.png_claiming(30_000, 30_000)  # 900 megapixels in a few hundred bytes
    assert len(bomb) < 1000
    response = upload(conv, token, bomb, "bomb.png")
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"
    # Pillow's own guard too, with kefu's limits out of the way.
    settings.KEFU_ATTACHMENT_MAX_PIXELS = 10**12
    settings.KEFU_ATTACHMENT_MAX_SIDE = 10**6
    with pytest.raises(attachments.TooLarge):
        attachments.judge(bomb, name="bomb.png")


def test_an_image_over_the_side_limit_is_refused(shopper):
    conv, token = shopper
    response = upload(conv, token, files.png_claiming(12_001, 10), "long.png")
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"


def test_a_file_over_the_size_limit_is_too_large(shopper, settings):
    settings.KEFU_ATTACHMENT_MAX_BYTES = 2000
    conv, token = shopper
    response = upload(conv, token, files.image_bytes("PNG", size=(400, 400), compress_level=0), "big.png")
    assert response.status_code == 413
    assert response.json()["error"] == {"code": "too_large", "message": "the file is over 2000 bytes"}
    assert not Attachment.objects.exists()


def test_the_body_limit_lets_one_file_through_on_the_upload_path_only(settings):
    settings.KEFU_ATTACHMENT_MAX_BYTES = 10 * 1024 * 1024
    assert body_limit.limit_for(UPLOAD) == 10 * 1024 * 1024 + settings.KEFU_ATTACHMENT_FORM_OVERHEAD_BYTES
    assert body_limit.limit_for("/console/") == settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert body_limit.limit_for(UPLOAD + "/x") == settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert json.loads(body_limit.refusal_body(1, UPLOAD))["error"]["code"] == "too_large"


async def test_the_asgi_guard_refuses_a_body_over_the_upload_limit_in_the_contract_shape(settings):
    settings.KEFU_ATTACHMENT_MAX_BYTES = 1000
    called = False

    async def app(scope, receive, send):  # never reached
        nonlocal called
        called = True

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "path": UPLOAD, "headers": [(b"content-length", b"999999")]}
    await body_limit.BodyLimit(app)(scope, receive, send)
    assert not called and sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["code"] == "too_large"


def test_the_conversation_cap_on_files_and_bytes(shopper, settings):
    conv, token = shopper
    settings.KEFU_ATTACHMENTS_PER_CONVERSATION = 2
    for _ in range(2):
        assert upload(conv, token, files.image_bytes("PNG"), "a.png").status_code == 201
    third = upload(conv, token, files.image_bytes("PNG"), "a.png")
    assert third.status_code == 413 and "2 files" in third.json()["error"]["message"]
    other, other_token = services.conversation_start(locale="en")
    settings.KEFU_ATTACHMENT_BYTES_PER_CONVERSATION = len(files.pdf_bytes()) * 3 // 2  # one fits, not two
    assert upload(other, other_token, files.pdf_bytes(), "a.pdf").status_code == 201
    over = upload(other, other_token, files.pdf_bytes(), "b.pdf")
    assert over.status_code == 413 and over.json()["error"]["code"] == "too_large"


def test_a_wrong_token_or_conversation_is_forbidden(shopper):
    conv, token = shopper
    for conversation, bad_token in ((conv, "not-the-token"), (conv, None), (None, token)):
        response = upload(conversation, bad_token, files.image_bytes("PNG"), "a.png")
        assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    other, _ = services.conversation_start(locale="en")
    assert upload(other, token, files.image_bytes("PNG"), "a.png").status_code == 403
    assert not Attachment.objects.exists()


def test_a_post_from_an_origin_not_allowed_is_forbidden(shopper):
    conv, token = shopper
    response = upload(conv, token, files.image_bytes("PNG"), "a.png", origin="https://evil.example")
    assert response.status_code == 403 and "Access-Control-Allow-Origin" not in response


def test_uploads_over_the_address_budget_get_429(shopper, monkeypatch):
    conv, token = shopper

    async def spent(address: str) -> bool:
        return False

    monkeypatch.setattr(limits, "upload_allowed", spent)
    response = upload(conv, token, files.image_bytes("PNG"), "a.png")
    assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limited"
    assert response["Retry-After"] and not Attachment.objects.exists()


def test_the_upload_budget_takes_a_burst_then_slows_to_the_minute_rate(settings):
    settings.KEFU_ATTACHMENT_BURST = 3
    settings.KEFU_ATTACHMENTS_PER_MINUTE_PER_IP = 4

    async def run() -> list[bool]:
        return [await limits.upload_allowed("203.0.113.9") for _ in range(4)] + [
            await limits.upload_allowed("203.0.113.10")
        ]

    assert asyncio.run(run()) == [True, True, True, False, True]  # the burst of 3, another address


# --- CORS ---------------------------------------------------------------------------------------


def test_the_preflight_is_answered_for_a_widget_origin():
    response = Client().options(
        UPLOAD,
        headers={
            "Origin": STORE,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-kefu-conversation, x-kefu-token",
        },
    )
    assert response.status_code == 204
    assert response["Access-Control-Allow-Origin"] == STORE
    assert "POST" in response["Access-Control-Allow-Methods"]
    allowed = {h.strip().lower() for h in response["Access-Control-Allow-Headers"].split(",")}
    assert {"x-kefu-conversation", "x-kefu-token"} <= allowed
    assert "Access-Control-Allow-Credentials" not in response


def test_the_preflight_is_refused_for_another_origin():
    response = Client().options(
        UPLOAD, headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert response.status_code == 403
    assert "Access-Control-Allow-Origin" not in response


# --- links --------------------------------------------------------------------------------------


def test_an_expired_link_is_gone_and_a_tampered_one_forbidden(shopper, settings):
    conv, token = shopper
    body = upload(conv, token, files.image_bytes("PNG"), "a.png").json()
    old = attachments.link_sign(body["id"], now=time.time() - settings.KEFU_ATTACHMENT_LINK_TTL_S - 1)
    expired = Client().get(old)
    assert expired.status_code == 410 and expired.json()["error"]["code"] == "expired"
    signed = body["url"].rsplit("/", 1)[1]
    tampered = Client().get(attachments.LINK_PREFIX + signed[:-2] + ("AA" if not signed.endswith("AA") else "BB"))
    assert tampered.status_code == 403 and tampered.json()["error"]["code"] == "forbidden"
    # A link is signed for attachments only: another signed value of kefu's is no link.
    from django.core import signing

    other = signing.dumps([body["id"], int(time.time()) + 999])
    assert Client().get(attachments.LINK_PREFIX + other).status_code == 403


def test_links_last_at_least_ten_minutes(settings):
    assert settings.KEFU_ATTACHMENT_LINK_TTL_S >= 600
    url = attachments.link_sign("abc", now=1000.0)
    assert attachments.link_open(url.rsplit("/", 1)[1], now=1000.0 + 599) == "abc"


# --- agents -------------------------------------------------------------------------------------


def test_an_agent_uploads_with_the_console_session(shopper, django_user_model):
    from django.contrib.auth.models import Permission

    conv, _ = shopper
    agent = django_user_model.objects.create_user("ana", password="pw-ana-123", is_staff=True)
    agent.user_permissions.add(Permission.objects.get(codename="handle_conversations"))
    console = Client()
    console.force_login(agent)
    response = upload(conv, None, files.image_bytes("PNG"), "fit.png", origin="http://testserver", client=console)
    assert response.status_code == 201, response.content
    assert Attachment.objects.get(pk=response.json()["id"]).role == Role.AGENT
    # Not from another origin, and not for someone who is not an agent.
    assert upload(conv, None, files.image_bytes("PNG"), "x.png", client=console).status_code == 403
    nobody = django_user_model.objects.create_user("bob", password="pw-bob-123")
    visitor = Client()
    visitor.force_login(nobody)
    assert (
        upload(conv, None, files.image_bytes("PNG"), "x.png", origin="http://testserver", client=visitor).status_code
        == 403
    )


# --- privacy ------------------------------------------------------------------------------------


def _sent_in_a_message(conv: Conversation, token: str) -> tuple[str, str]:
    body = upload(conv, token, files.image_bytes("PNG"), "a.png").json()
    services.message_receive(conversation_id=conv.pk, client_id="c1", text="", attachments=[body["id"]])
    return body["id"], Attachment.objects.get(pk=body["id"]).file.name


def test_retention_removes_the_files_with_the_conversation(shopper, settings):
    from datetime import timedelta

    from django.utils import timezone

    conv, token = shopper
    attachment_id, name = _sent_in_a_message(conv, token)
    loose = upload(conv, token, files.pdf_bytes(), "never-sent.pdf").json()
    loose_name = Attachment.objects.get(pk=loose["id"]).file.name
    storage = storages["attachments"]
    assert storage.exists(name) and storage.exists(loose_name)
    Conversation.objects.filter(pk=conv.pk).update(updated_at=timezone.now() - timedelta(days=40))
    settings.KEFU_RETENTION_DAYS = 30

    removed = retention.conversations_purge()

    assert removed.files == 2 and "2 files" in removed.describe()
    assert not storage.exists(name) and not storage.exists(loose_name)
    assert not Attachment.objects.exists()


def test_erase_removes_the_files_and_export_lists_them(shopper):
    conv, token = shopper
    attachment_id, name = _sent_in_a_message(conv, token)
    out = StringIO()
    call_command("shopper_data", "export", "--conversation", str(conv.pk), stdout=out)
    exported = json.loads(out.getvalue())["conversations"][0]
    assert exported["messages"][0]["attachments"] == [attachment_id]
    assert [(a["id"], a["message_seq"], a["path"]) for a in exported["attachments"]] == [(attachment_id, 1, name)]

    call_command("shopper_data", "erase", "--conversation", str(conv.pk), "--yes", stdout=StringIO())

    assert not storages["attachments"].exists(name)
    assert not Attachment.objects.exists() and not Message.objects.exists()


def test_an_agent_message_sends_only_the_agents_own_unsent_files(shopper, django_user_model):
    from chat.errors import AttachmentRefused
    from chat.models import ConversationStatus

    conv, token = shopper
    agent = django_user_model.objects.create_user("ana", password="pw-ana-123", is_staff=True)
    Conversation.objects.filter(pk=conv.pk).update(status=ConversationStatus.AGENT, agent=agent, agent_name="Ana")
    shoppers_file = upload(conv, token, files.image_bytes("PNG"), "a.png").json()["id"]
    judged = attachments.judge(files.image_bytes("JPEG"), name="fit.jpg")
    agents_file = services.attachment_store(conversation_id=conv.pk, judged=judged, role=Role.AGENT).pk
    with pytest.raises(AttachmentRefused):
        services.agent_message_send(
            conversation_id=conv.pk, agent=agent, text="", client_id="a1", attachments=[shoppers_file]
        )
    assert not Message.objects.exists()
    sent = services.agent_message_send(
        conversation_id=conv.pk, agent=agent, text="", client_id="a2", attachments=[agents_file]
    )
    assert sent.message.attachments[0]["id"] == agents_file and sent.message.role == Role.AGENT
    item = selectors.message_item(sent.message)
    assert attachments.link_open(item["attachments"][0]["url"].rsplit("/", 1)[1]) == agents_file
