/* kefu ops pages (templates/ops_canary.html): a form with data-confirm is sent only once staff
   confirm its question (promote or roll back a canary candidate). No inline script (strict CSP);
   without script the forms still work, unconfirmed. */
(function () {
  "use strict";

  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    const question = form.dataset.confirm;
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();

/* kefu ops dashboard: draws /ops/api/series with uPlot (static/vendor/uplot), shows times in the
   viewer's time zone, and turns the custom period form's local times into UTC epoch seconds.
   Loaded with `defer` after uPlot and the page's catalog of translations (Django's
   JavaScriptCatalog at /console/i18n/js/: gettext and interpolate in the agent's language); no
   inline script or style (the page's CSP forbids both). */
(function () {
  "use strict";

  // The catalog's functions; the English text as it is when the catalog did not load.
  var gettext = window.gettext || function (s) { return s; };
  var interpolate = window.interpolate || function (fmt, obj) {
    return fmt.replace(/%\((\w+)\)s/g, function (m, k) { return String(obj[k]); });
  };
  var lang = document.documentElement.lang || undefined;

  var root = document.getElementById("charts");
  var statusEl = document.getElementById("charts-status");
  var tz = (Intl.DateTimeFormat().resolvedOptions().timeZone) || "UTC";
  var HEIGHT = 220;
  var SMALL_HEIGHT = 170;
  var COLORS = {
    "faq": "#1a7f37", "action": "#8250df", "product": "#1b7c83", "cache.exact": "#0a7c86", "cache.semantic": "#54aeff",
    "llm.simple": "#0b5cad", "llm.medium": "#bf8700", "llm.complex": "#cf222e", "decline": "#6e7781",
    "handoff": "#953800", "simple": "#0b5cad", "medium": "#bf8700", "complex": "#cf222e", "cache": "#0a7c86"
  };
  var SPARE = ["#1f6feb", "#d4a72c", "#a40e26", "#2da44e", "#8c959f", "#bc4c00"];
  var charts = [];

  function color(name, i) { return COLORS[name] || SPARE[i % SPARE.length]; }

  function setStatus(text, isError) {
    if (!statusEl) { return; }
    statusEl.textContent = text;
    statusEl.classList.toggle("ops__status--error", !!isError);
  }

  function fixed(digits) {
    return function (u, v) { return v == null ? "—" : v.toFixed(digits); };
  }
  function percent(u, v) { return v == null ? "—" : (v * 100).toFixed(1) + "%"; }
  function usd(u, v) { return v == null ? "—" : "$" + (v < 1 ? v.toFixed(4) : v.toFixed(2)); }

  function line(label, stroke, value, extra) {
    var s = { label: label, stroke: stroke, width: 2, value: value, spanGaps: false, points: { size: 5 } };
    if (extra) { Object.keys(extra).forEach(function (k) { s[k] = extra[k]; }); }
    return s;
  }

  // The time axis and the legend's time in the agent's locale and zone (Intl), not uPlot's
  // US-style "12/7" and "3pm".
  var DAY = 86400;
  var timeFmt = new Intl.DateTimeFormat(lang, { hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZone: tz });
  var dayFmt = new Intl.DateTimeFormat(lang, { month: "short", day: "numeric", timeZone: tz });
  var fullFmt = new Intl.DateTimeFormat(lang, { dateStyle: "medium", timeStyle: "short", hourCycle: "h23", timeZone: tz });
  function timeAxis(u, splits, axisIdx, space, incr) {
    return splits.map(function (t) { return (incr >= DAY ? dayFmt : timeFmt).format(new Date(t * 1000)); });
  }
  function timeValue(u, t) { return t == null ? "—" : fullFmt.format(new Date(t * 1000)); }

  function draw(figure, series, data, opts) {
    var plot = figure.querySelector(".chart__plot") || figure;
    plot.textContent = "";
    var options = {
      width: Math.max(240, plot.clientWidth),
      height: (opts && opts.height) || HEIGHT,
      scales: Object.assign({ x: { time: true } }, (opts && opts.scales) || {}),
      axes: ((opts && opts.axes) || [{}, { size: 56 }]).map(function (axis, i) {
        return i === 0 ? Object.assign({ values: timeAxis }, axis) : axis;
      }),
      series: [{ label: gettext("time"), value: timeValue }].concat(series),
      bands: (opts && opts.bands) || [],
      legend: { live: true },
      cursor: { drag: { x: false, y: false } }
    };
    var chart = new uPlot(options, data, plot);
    charts.push({ chart: chart, plot: plot });
    return chart;
  }

  function axisValues(fmt) {
    return function (u, vals) { return vals.map(function (v) { return fmt(u, v); }); };
  }
  function percentAxis(u, vals) {
    return vals.map(function (v) { return v == null ? "" : Math.round(v * 100) + "%"; });
  }

  function translucent(hex) { return hex + "55"; }

  // Answers by route as stacked areas: each route's band sits on the routes before it (the
  // top line is the total); the legend shows each route's own count, not the running sum.
  function answers(d) {
    var routes = Object.keys(d.answers);
    var fig = document.getElementById("chart-answers");
    var sums = d.t.map(function () { return 0; });
    var stacked = routes.map(function (r) {
      sums = sums.map(function (s, i) { return s + d.answers[r][i]; });
      return sums.slice();
    });
    var own = function (r) {
      return function (u, v, si, i) { return i == null ? "—" : String(d.answers[r][i]); };
    };
    var series = routes.map(function (r, i) {
      return { label: r, stroke: color(r, i), fill: translucent(color(r, i)), width: 1, value: own(r), points: { show: false } };
    });
    var bands = routes.slice(1).map(function (r, i) { return { series: [i + 2, i + 1] }; });
    draw(fig, series, [d.t].concat(stacked), {
      bands: bands,
      scales: { y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } }
    });
  }

  function money(d) {
    var m = d.money;
    var fig = document.getElementById("chart-money");
    if (m.t.length && d.money.t.length !== d.t.length) {
      fig.querySelector("figcaption").textContent = gettext("Spend and savings per day (USD)");
    }
    draw(fig, [
      line(gettext("spent"), "#cf222e", usd),
      line(gettext("saved"), "#1a7f37", usd),
      line(gettext("without the cache"), "#bf8700", usd, { dash: [6, 4] }),
      line(gettext("same calls, all complex"), "#6e7781", usd, { dash: [2, 4] })
    ], [m.t, m.spent_usd, m.saved_usd, m.no_cache_usd, m.all_complex_usd], {
      scales: { y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.05 : 0.01]; } } },
      axes: [{}, { size: 64, values: axisValues(usd) }]
    });
  }

  function cache(d) {
    var fig = document.getElementById("chart-cache");
    draw(fig, [
      line(gettext("hit rate"), "#0a7c86", percent),
      line(gettext("false-hit rate (audits)"), "#cf222e", percent),
      line(gettext("audits"), "#8c959f", fixed(0), { scale: "n", width: 1 })
    ], [d.t, d.cache.hit_rate, d.cache.false_hit_rate, d.cache.audits], {
      scales: { y: { range: [0, 1] }, n: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
      axes: [{}, { size: 50, values: percentAxis }, { scale: "n", side: 1, grid: { show: false }, size: 40 }]
    });
  }

  function queue(d) {
    var q = d.queue;
    var fig = document.getElementById("chart-queue");
    draw(fig, [
      line(gettext("handoffs"), "#953800", fixed(0)),
      line(gettext("waiting (most)"), "#bf8700", fixed(0)),
      line(gettext("with an agent (most)"), "#1a7f37", fixed(0)),
      line(gettext("wait p50 (s)"), "#0b5cad", fixed(1), { scale: "s" }),
      line(gettext("wait p95 (s)"), "#8250df", fixed(1), { scale: "s", dash: [6, 4] })
    ], [d.t, q.handoffs, q.waiting_max, q.with_agent_max, q.wait_s_p50, q.wait_s_p95], {
      scales: {
        y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } },
        s: { range: function (u, min, max) { return [0, Math.max(1, max || 0)]; } }
      },
      axes: [{}, { size: 44 }, { scale: "s", side: 1, grid: { show: false }, size: 48, label: "s" }]
    });
  }

  function ratings(d) {
    var labels = Object.keys(d.ratings.down_rate);
    var fig = document.getElementById("chart-ratings");
    if (d.ratings.t.length !== d.t.length) {
      fig.querySelector("figcaption").textContent = gettext("Thumbs-down rate by tier, per day (of rated answers)");
    }
    draw(fig, labels.map(function (l, i) { return line(l, color(l, i), percent); }),
      [d.ratings.t].concat(labels.map(function (l) { return d.ratings.down_rate[l]; })), {
        scales: { y: { range: [0, 1] } },
        axes: [{}, { size: 50, values: percentAxis }]
      });
  }

  function ttft(d) {
    var holder = document.getElementById("chart-ttft");
    holder.textContent = "";
    var routes = Object.keys(d.ttft_ms);
    if (!routes.length) {
      var p = document.createElement("p");
      p.className = "chart__empty";
      p.textContent = gettext("No answers in this window.");
      holder.appendChild(p);
      return;
    }
    // All the figures first, then the charts: each is sized once the grid has its final columns.
    var figures = routes.map(function (r) {
      var fig = document.createElement("figure");
      fig.className = "chart chart--ttft";
      fig.id = "chart-ttft-" + r.replace(/[^a-z0-9]+/gi, "-");
      var cap = document.createElement("figcaption");
      cap.textContent = r;
      var plot = document.createElement("div");
      plot.className = "chart__plot";
      fig.appendChild(cap);
      fig.appendChild(plot);
      holder.appendChild(fig);
      return fig;
    });
    routes.forEach(function (r, i) {
      var fig = figures[i];
      var t = d.ttft_ms[r];
      draw(fig, [
        line("p50", "#1a7f37", fixed(1)),
        line("p95", "#bf8700", fixed(1)),
        line("p99", "#cf222e", fixed(1))
      ], [d.t, t.p50, t.p95, t.p99], {
        height: SMALL_HEIGHT,
        scales: { y: { range: function (u, min, max) { return [0, Math.max(1, (max || 0) * 1.1)]; } } }
      });
    });
  }

  // A table's body from rows: each row a header cell and data cells; one full-width line when empty.
  function fillTable(selector, rows, emptyText, columns, cells) {
    var body = document.querySelector(selector + " tbody");
    if (!body) { return; }
    body.textContent = "";
    if (!rows.length) {
      var tr0 = document.createElement("tr");
      var td0 = document.createElement("td");
      td0.colSpan = columns;
      td0.textContent = emptyText;
      tr0.appendChild(td0);
      body.appendChild(tr0);
      return;
    }
    rows.forEach(function (row) {
      var texts = cells(row);
      var tr = document.createElement("tr");
      var th = document.createElement("th");
      th.scope = "row";
      th.textContent = texts[0];
      tr.appendChild(th);
      texts.slice(1).forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }

  function faqTable(d) {
    fillTable("#faq-ratings", d.faq, gettext("No FAQ answers in this window."), 5, function (f) {
      return [f.question ? f.intent + " [" + f.locale + "]: " + f.question : interpolate(gettext("entry %(id)s (deleted)"), { id: f.id }, true),
        String(f.answers), String(f.up), String(f.down), percent(null, f.down_rate)];
    });
  }

  function intentTable(d) {
    fillTable("#cache-intents", d.cache_intents || [], gettext("No cache audits in this window."), 5, function (r) {
      return [r.intent, String(r.counted), String(r.false_hits), percent(null, r.false_hit_rate),
        percent(null, r.low) + " – " + percent(null, r.high)];
    });
  }

  function stepName(step) {
    return step === 300 ? gettext("5 minutes") : step === 3600 ? gettext("1 hour") : gettext("1 day");
  }

  function localTimes() {
    ["window-from", "window-to"].forEach(function (id) {
      var el = document.getElementById(id);
      if (el) {
        el.textContent = new Intl.DateTimeFormat(lang, { dateStyle: "medium", timeStyle: "medium", timeZone: tz })
          .format(new Date(el.getAttribute("datetime")));
      }
    });
    var zone = document.getElementById("window-zone");
    if (zone) { zone.textContent = "(" + tz + ")"; }
    var hint = document.getElementById("period-zone");
    if (hint) { hint.textContent = interpolate(gettext("(times in %(zone)s)"), { zone: tz }, true); }
  }

  function localInput(epoch) {
    var t = new Date(epoch * 1000);
    var pad = function (n) { return String(n).padStart(2, "0"); };
    return t.getFullYear() + "-" + pad(t.getMonth() + 1) + "-" + pad(t.getDate()) + "T" + pad(t.getHours()) + ":" + pad(t.getMinutes());
  }

  function periodForm() {
    var form = document.getElementById("period");
    if (!form || !root) { return; }
    var from = document.getElementById("period-from");
    var to = document.getElementById("period-to");
    from.value = localInput(Number(root.dataset.from));
    to.value = localInput(Number(root.dataset.to));
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var a = Math.floor(new Date(from.value).getTime() / 1000);
      var b = Math.floor(new Date(to.value).getTime() / 1000);
      if (!(a < b)) {
        setStatus(gettext("The period's end must come after its start."), true);
        return;
      }
      window.location.assign("/ops/?from=" + a + "&to=" + b);
    });
  }

  function resize() {
    charts.forEach(function (c) { c.chart.setSize({ width: Math.max(240, c.plot.clientWidth), height: c.chart.height }); });
  }

  localTimes();
  periodForm();
  if (!root) { return; }
  if (typeof uPlot === "undefined") {
    setStatus(gettext("The chart library did not load; the figures below are complete."), true);
    return;
  }
  setStatus(gettext("Loading charts…"), false);
  var url = "/ops/api/series?from=" + root.dataset.from + "&to=" + root.dataset.to + "&tz=" + encodeURIComponent(tz);
  fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then(function (r) {
      if (!r.ok) { return r.json().then(function (b) { throw new Error(b.error || ("HTTP " + r.status)); }); }
      return r.json();
    })
    .then(function (d) {
      answers(d);
      money(d);
      cache(d);
      queue(d);
      ratings(d);
      ttft(d);
      faqTable(d);
      intentTable(d);
      setStatus(interpolate(gettext("Buckets of %(step)s, times in %(zone)s; %(hours)s hours read from the rollups, the rest from the raw rows."),
        { step: stepName(d.window.step), zone: tz, hours: d.source.rolled_hours }, true), false);
      root.dataset.ready = "1";
      var timer = null;
      window.addEventListener("resize", function () {
        clearTimeout(timer);
        timer = setTimeout(resize, 150);
      });
    })
    .catch(function (e) {
      setStatus(interpolate(gettext("Charts could not be loaded: %(error)s"), { error: e.message }, true), true);
      root.dataset.ready = "error";
    });
})();
