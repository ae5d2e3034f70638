"""FAQ changes without stalls: saving an entry retrains in the background (the admin request and
the server's sync thread return at once, chats keep being answered by the old model), and the
new model, its scope classifier and its entries are swapped in together."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from routing.faq import trainer
from routing.faq.importer import faq_import, validate
from routing.faq.registry import faq_changed, registry

NEW_ENTRY = {
    "intent": "gift_wrap",
    "locale": "en",
    "question": "Do you offer gift wrapping?",
    "variants": ["can you gift wrap my order", "is gift wrapping available", "wrap it as a present"],
    "answer": "Yes: add gift wrapping at checkout for $4.",
}


@pytest.fixture
def held_training(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """A retrain (``routing.faq.trainer.train``, the trainer process) blocks until ``release`` is set;
    ``started`` says a training began."""
    started, release = threading.Event(), threading.Event()
    train = trainer.train

    def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert release.wait(60), "the test never released the training"
        return train(*args, **kwargs)

    monkeypatch.setattr(trainer, "train", held)
    yield started, release
    release.set()
    assert registry.wait_retrained(60)


def add_entry() -> None:
    faq_import([validate(NEW_ENTRY, 1)])


@pytest.mark.django_db(transaction=True)
def test_faq_changed_returns_at_once_and_the_old_model_answers_until_the_new_one_is_in(faq, held_training):
    started, release = held_training
    old = registry.snapshot
    add_entry()
    faq_changed()  # with a synchronous retrain this line would block on the held training forever
    assert started.wait(30)  # the retrain runs, in another thread
    assert registry.snapshot is old and "gift_wrap" not in {e.intent for e in registry.entries.values()}
    release.set()
    assert registry.wait_retrained(60)
    new = registry.snapshot
    assert new is not old and new.model is not old.model
    assert "gift_wrap" in {e.intent for e in new.entries.values()}
    assert {(e.intent, e.locale) for e in new.entries.values()} == set(new.by_intent)


@pytest.mark.django_db(transaction=True)
def test_writes_during_a_retrain_are_trained_on_by_one_more_retrain(faq, held_training):
    started, release = held_training
    add_entry()
    faq_changed()
    assert started.wait(30)
    faq_import(
        [
            validate(
                {
                    **NEW_ENTRY,
                    "intent": "gift_cards",
                    "question": "Do you sell gift cards?",
                    "variants": ["can I buy a gift card", "gift vouchers"],
                    "answer": "Yes, from $10.",
                },
                1,
            )
        ]
    )
    faq_changed()  # written while the first retrain trains on the rows before it
    faq_changed()
    release.set()
    assert registry.wait_retrained(60)
    assert {"gift_wrap", "gift_cards"} <= {e.intent for e in registry.entries.values()}


@pytest.mark.django_db(transaction=True)
def test_saving_an_entry_in_the_admin_does_not_wait_for_the_training(admin_client, faq, held_training):
    started, release = held_training
    entry = registry.snapshot.entries[min(registry.snapshot.entries)]
    response = admin_client.post(
        f"/admin/routing/faqentry/{entry.entry_id}/change/",
        {
            "intent": entry.intent,
            "locale": entry.locale,
            "question": entry.question,
            "answer": entry.answer + " (updated)",
            "variants": '["a phrasing added in the admin"]',  # a phrasing changed: a retrain
            "active": "on",
        },
    )
    assert response.status_code == 302, response.content[:500]  # saved and redirected, training held
    assert started.wait(30)
    release.set()
    assert registry.wait_retrained(60)
    assert registry.entries[entry.entry_id].answer.endswith("(updated)")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_chats_are_answered_while_the_faq_retrains(make_client, faq, held_training):
    started, release = held_training
    await database_sync_to_async(add_entry)()
    # faq_changed on the server's sync thread, as the admin's save runs under Daphne.
    await database_sync_to_async(faq_changed)()
    assert await database_sync_to_async(started.wait)(30)
    shopper = await make_client()
    await shopper.hello()
    await shopper.say("how long does delivery take?")
    end = (await shopper.until("stream.end"))[-1]  # the sync thread is free; the old model answers
    assert end["route"] == "faq" and end["text"].startswith("Orders ship within 1 business day")
    release.set()


@pytest.mark.django_db(transaction=True)
def test_an_edit_of_an_answer_alone_swaps_the_entries_in_without_training(faq, monkeypatch):
    calls: list[int] = []
    train, train_here = trainer.train, trainer.train_here

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return train(*args, **kwargs)

    def counted_here(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return train_here(*args, **kwargs)

    monkeypatch.setattr(trainer, "train", counted)
    monkeypatch.setattr(trainer, "train_here", counted_here)
    old = registry.snapshot
    entry = old.entries[min(old.entries)]
    from routing.models import FaqEntry

    FaqEntry.objects.filter(pk=entry.entry_id).update(answer="A new answer text.")
    faq_changed()
    assert registry.wait_retrained(60)
    assert calls == []  # nothing the models learn from changed
    assert registry.snapshot is not old and registry.model is old.model and registry.scope is old.scope
    assert registry.entries[entry.entry_id].answer == "A new answer text."


@pytest.mark.django_db(transaction=True)
def test_a_retrain_runs_in_the_trainer_process_and_its_model_answers_here(faq):
    assert registry.trained_by == os.getpid()  # the first model: trained in this process
    add_entry()
    faq_changed()
    assert registry.wait_retrained(120)
    assert registry.trained_by not in (0, os.getpid())  # trained in the child, at nice 19
    match = registry.model.match("can you gift wrap my order", locale="en")
    entry = registry.entries[match.entry_id]
    assert match.accepted and entry.intent == "gift_wrap"
    assert not registry.scope.classify("can you gift wrap my order").out_of_scope
    # The same decisions as models trained here: the child's embedder is the same model.
    here, scope_here = trainer.train_here(*registry.snapshot.trained_on)
    for text in ("is gift wrapping available", "how long does delivery take?", "who won the match?"):
        theirs, mine = registry.model.match(text, locale="en"), here.match(text, locale="en")
        assert (theirs.entry_id, theirs.reason) == (mine.entry_id, mine.reason)
        assert theirs.confidence == pytest.approx(mine.confidence, abs=1e-5)
        assert registry.scope.classify(text).probability == pytest.approx(
            scope_here.classify(text).probability, abs=1e-5
        )


@pytest.mark.django_db(transaction=True)
def test_a_retrain_whose_trainer_process_fails_trains_here(faq, monkeypatch, caplog):
    from concurrent.futures.process import BrokenProcessPool

    class Broken:
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            raise BrokenProcessPool("the child was killed")

        def shutdown(self, **kwargs: Any) -> None:
            pass

    monkeypatch.setattr(trainer, "_executor", lambda: Broken())
    add_entry()
    faq_changed()
    assert registry.wait_retrained(120)
    assert registry.trained_by == os.getpid()
    assert "gift_wrap" in {e.intent for e in registry.entries.values()}
    assert "the trainer process failed (BrokenProcessPool" in caplog.text


def test_a_killed_server_leaves_no_trainer_process_behind(tmp_path):
    """kill -9 of the process that started the trainer: the trainer exits by itself."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "server.py"
    root = Path(__file__).resolve().parents[2]
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "def main():\n"
        "    import django\n"
        "    os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings_test')\n"
        "    django.setup()\n"
        "    from routing.faq import trainer\n"
        "    from routing.faq.model import FaqTrainingEntry\n"
        "    entries = [FaqTrainingEntry(1, 'returns', 'en', ('can I return an item', 'send it back')),\n"
        "               FaqTrainingEntry(2, 'shipping', 'en', ('how long does delivery take', 'when will it arrive'))]\n"
        "    _model, _scope, pid = trainer.train(entries, (0.5, 0.5, 0.5, 0.5))\n"
        "    print(pid, flush=True)\n"
        "    time.sleep(600)\n"
        "if __name__ == '__main__':  # the trainer is spawned: it imports this module again\n"
        "    main()\n"
    )
    server = subprocess.Popen([sys.executable, str(script)], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        child = int(line)
        assert child != server.pid
        os.kill(child, 0)  # the trainer is alive
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        try:  # reap it if it was re-parented to us (a subreaper); harmless otherwise
            os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    else:
        pytest.fail(f"the trainer process {child} outlived its server")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_classification_prefetched_before_the_faq_changed_is_not_used(faq: Any) -> None:
    """A message's classification starts as it arrives (routing.decide.classify.prefetch); one that is
    never consumed (a resent duplicate) must not answer a later message with the FAQ as it was."""
    from routing.decide import classify

    classify.prefetch(text="do you accept paypal?", conversation_locale="en")
    stale = await classify._prefetched[("do you accept paypal?", "en")]
    assert stale.match is not None and stale.match.accepted  # the FAQ as it was: it answers
    registry.model = None  # then the FAQ changes (here: unloaded) before anyone consumes it
    now = await classify.classified("do you accept paypal?", "en")
    assert now.match is None and now.faq_state is registry.snapshot
    assert ("do you accept paypal?", "en") not in classify._prefetched
