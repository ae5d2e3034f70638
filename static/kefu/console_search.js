/* kefu agent console: the search box (templates/console.html, docs/search.md). Searches
   GET /console/api/search?q= as the agent types (after a pause) or presses Enter; "/" anywhere
   outside a text field focuses the box, Escape closes the results. A result opens the
   conversation in the console (the "kefu:open-conversation" event console.js listens to).
   The words shown come from the form's data-* attributes, translated by Django's i18n in the
   template; every text is set with textContent, never parsed as HTML (strict CSP). */
(function () {
  "use strict";

  const form = document.getElementById("search");
  if (!form) return;
  const input = document.getElementById("search-q");
  const panel = document.getElementById("search-results");
  const status = document.getElementById("search-status");
  const list = document.getElementById("search-list");
  const t = form.dataset;
  const STATUS = { bot: t.statusBot, waiting_agent: t.statusWaiting, agent: t.statusAgent, closed: t.statusClosed };
  const PAUSE_MS = 250; // typing pause before a search: one request per burst of keys
  const lang = document.documentElement.lang || undefined;
  let timer = null;
  let seq = 0; // answers older than the newest request are dropped

  function typingInField(target) {
    if (!target || !target.tagName) return false;
    const tag = target.tagName.toLowerCase();
    return tag === "input" || tag === "textarea" || tag === "select" || target.isContentEditable;
  }

  document.addEventListener("keydown", (e) => {
    if (e.key === "/" && !e.ctrlKey && !e.metaKey && !e.altKey && !typingInField(e.target)) {
      e.preventDefault();
      input.focus();
      input.select();
    } else if (e.key === "Escape" && (document.activeElement === input || !panel.hidden)) {
      close();
      input.blur();
    }
  });

  function close() {
    panel.hidden = true;
    list.replaceChildren();
    status.textContent = "";
  }

  function when(iso) {
    const d = new Date(iso);
    return isNaN(d) ? "" : d.toLocaleString(lang, { dateStyle: "medium", timeStyle: "short" });
  }

  function show(results) {
    list.replaceChildren();
    status.textContent = results.length ? t.found.replace("{count}", String(results.length)) : t.none;
    for (const r of results) {
      const li = document.createElement("li");
      const btn = document.createElement("button");
      btn.type = "button";
      btn.className = "search__hit";
      btn.dataset.conversation = r.conversation;
      const head = document.createElement("span");
      head.className = "search__meta";
      head.textContent = `${STATUS[r.status] || r.status} · ${when(r.last_message_at)} · ${r.conversation.slice(0, 8)}`;
      const snippet = document.createElement("span");
      snippet.className = "search__snippet";
      snippet.textContent = r.snippet;
      btn.append(head, snippet);
      btn.addEventListener("click", () => {
        document.dispatchEvent(new CustomEvent("kefu:open-conversation", { detail: { id: r.conversation } }));
        close();
      });
      li.append(btn);
      list.append(li);
    }
    panel.hidden = false;
  }

  async function run() {
    clearTimeout(timer);
    const q = input.value.trim();
    if (!q) return close();
    const mine = ++seq;
    status.textContent = t.searching;
    panel.hidden = false;
    let body;
    try {
      const resp = await fetch(`${form.dataset.url}?q=${encodeURIComponent(q)}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      body = await resp.json();
      if (!resp.ok) throw new Error((body.error && body.error.message) || String(resp.status));
    } catch (err) {
      if (mine === seq) {
        list.replaceChildren();
        status.textContent = `${t.failed} ${err.message || ""}`.trim();
      }
      return;
    }
    if (mine === seq) show(body.results);
  }

  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(run, PAUSE_MS);
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    run();
  });
})();
