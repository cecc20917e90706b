/* Job page: the live log panel (WebSocket stream, resumes after the last line seen), the metrics charts
   (redrawn from the same stream), log search, the TensorBoard link, and a refresh of the header and history
   when the job changes state. */
(function () {
  "use strict";

  const panel = document.getElementById("log-panel");
  if (!panel) return;
  const text = JSON.parse(document.getElementById("log-strings").textContent);
  const fmt = (template, params) => template.replace(/%\((\w+)\)s/g, (_, key) => String(params[key]));

  const jobId = panel.dataset.job;
  const maxLines = parseInt(panel.dataset.maxLines, 10) || 5000;
  const tail = parseInt(panel.dataset.tail, 10) || 1000;
  const statusEl = document.getElementById("log-status");
  const noticeEl = document.getElementById("log-notice");
  const follow = document.getElementById("log-follow");
  const pauseButton = document.getElementById("log-pause");
  const attemptSelect = document.getElementById("log-attempt");
  const download = document.getElementById("log-download");
  const live = document.getElementById("job-header");
  const announcer = document.getElementById("state-announcer");
  const business = document.querySelector('[data-part="business"]');

  let attempt = parseInt(panel.dataset.attempt, 10) || 1;
  let latest = attempt;
  let lastSeen = null; // the highest line number shown: where a reconnect resumes
  let socket = null;
  let paused = false;
  let ended = false;
  let retryMs = 500;
  let retryTimer = null;
  let trimmed = false;
  let dropped = "";

  function currentState() {
    const badge = live && live.querySelector("[data-role=state]");
    return badge ? badge.dataset.state : "";
  }

  function currentReason() {
    const badge = live && live.querySelector("[data-role=state]");
    return badge ? badge.dataset.reason || "" : "";
  }

  function jobTerminal() {
    return ["succeeded", "failed", "cancelled", "timed_out"].includes(currentState());
  }

  function setStatus(message, cls) {
    statusEl.textContent = message;
    statusEl.className = "log-status" + (cls ? " " + cls : "");
  }

  function showNotice() {
    const parts = [dropped, trimmed ? fmt(text.trimmed, { max: maxLines }) : ""].filter(Boolean);
    noticeEl.hidden = parts.length === 0;
    noticeEl.textContent = parts.join(" ");
  }

  function lineElement(number, body, cls) {
    const row = document.createElement("div");
    row.className = "log-line" + (cls ? " " + cls : "");
    const n = document.createElement("span");
    n.className = "n";
    n.textContent = number;
    const t = document.createElement("span");
    t.className = "t";
    t.textContent = body;
    row.append(n, t);
    return row;
  }

  function append(lines) {
    const fragment = document.createDocumentFragment();
    for (const line of lines) {
      if (lastSeen !== null && line.n <= lastSeen) continue;
      fragment.appendChild(lineElement(line.n, line.text));
      lastSeen = line.n;
    }
    panel.appendChild(fragment);
    let extra = panel.childElementCount - maxLines;
    if (extra > 0) {
      trimmed = true;
      while (extra-- > 0) panel.firstElementChild.remove();
      showNotice();
    }
    if (follow.checked) panel.scrollTop = panel.scrollHeight;
  }

  function closeSocket() {
    clearTimeout(retryTimer);
    if (socket) {
      const old = socket;
      socket = null;
      old.close();
    }
  }

  function connect() {
    closeSocket();
    const params = new URLSearchParams({ attempt: String(attempt), tail: String(tail) });
    // The metrics charts ride on the same socket: the server redraws them when the job reports something new.
    if (business) {
      params.set("metrics", business.dataset.version || "0");
      params.set("lang", document.documentElement.lang || "en");
    }
    if (lastSeen !== null) params.set("after", String(lastSeen));
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${location.host}/ws/jobs/${jobId}/logs/?${params}`);
    socket = ws;
    setStatus(text.connecting);
    ws.onmessage = (event) => {
      if (socket === ws) handle(JSON.parse(event.data));
    };
    ws.onclose = (event) => {
      if (socket !== ws) return;
      socket = null;
      if (event.code === 4403) {
        setStatus(text.forbidden, "is-bad");
        return;
      }
      if (paused || (ended && jobTerminal())) return;
      setStatus(text.reconnecting, "is-bad");
      retryTimer = setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }

  function handle(message) {
    switch (message.type) {
      case "hello":
        retryMs = 500;
        ended = false;
        setStatus(text.live, "is-live");
        // A change between rendering this page and subscribing would otherwise go unseen.
        if (message.state !== currentState()) scheduleRefresh();
        dropped = message.dropped_lines > 0
          ? fmt(text.dropped, { count: message.dropped_lines, first: message.first_kept_line }) : "";
        showNotice();
        break;
      case "lines":
        if (message.attempt === attempt) append(message.lines);
        break;
      case "state":
        // A waiting job's reason changes without its state: the dispatcher's pass tells it too.
        if (message.state !== currentState() || (message.reason && message.reason !== currentReason())) {
          scheduleRefresh();
        }
        break;
      case "attempt":
        if (message.attempt > latest) {
          const following = attempt === latest;
          latest = message.attempt;
          addAttemptOption(latest);
          if (following) switchAttempt(latest, true);
        }
        break;
      case "metrics":
        if (business) {
          business.innerHTML = message.html;
          business.dataset.version = String(message.version);
        }
        break;
      case "end":
        ended = true;
        setStatus(text.ended);
        if (!jobTerminal()) scheduleRefresh(1000);
        break;
    }
  }

  function addAttemptOption(number) {
    if (!attemptSelect.querySelector(`option[value="${number}"]`)) {
      const option = document.createElement("option");
      option.value = option.textContent = String(number);
      attemptSelect.appendChild(option);
    }
  }

  function switchAttempt(number, announce) {
    attempt = number;
    lastSeen = null;
    trimmed = false;
    dropped = "";
    ended = false;
    showNotice();
    panel.replaceChildren();
    if (announce) panel.appendChild(lineElement("", fmt(text.new_attempt, { attempt: number }), "marker"));
    attemptSelect.value = String(number);
    download.href = `${panel.dataset.download}?attempt=${number}`;
    if (!paused) connect();
  }

  attemptSelect.addEventListener("change", () => switchAttempt(parseInt(attemptSelect.value, 10), false));

  pauseButton.addEventListener("click", () => {
    paused = !paused;
    pauseButton.setAttribute("aria-pressed", String(paused));
    pauseButton.textContent = paused ? text.resume : text.pause;
    if (paused) {
      closeSocket();
      setStatus(text.paused);
    } else {
      connect();
    }
  });

  window.addEventListener("online", () => {
    if (!socket && !paused) connect();
  });

  // Header, timeline and attempts: re-rendered by the server when the stream reports a state change.
  let refreshTimer = null;
  function scheduleRefresh(delayMs) {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refreshLive, delayMs || 150);
  }

  function refreshLive() {
    fetch(live.dataset.url, { credentials: "same-origin" })
      .then((response) => (response.ok ? response.text() : Promise.reject(response.status)))
      .then((html) => {
        const fresh = new DOMParser().parseFromString(html, "text/html");
        fresh.querySelectorAll("[data-part]").forEach((part) => {
          const target = document.querySelector(`[data-part="${part.dataset.part}"]`);
          if (target) target.innerHTML = part.innerHTML;
        });
        const badge = live.querySelector("[data-role=state]");
        if (badge) announcer.textContent = badge.textContent;
        checkTensorBoard();
      })
      .catch(() => {});
  }

  // While it waits, the estimate ages and others' jobs end: the header is read again now and then (level-triggered:
  // a message lost on the way costs one period).
  setInterval(() => {
    if (currentState() === "pending" && !document.hidden) refreshLive();
  }, 20000);

  let tbTimer = null;
  function checkTensorBoard() {
    const el = document.getElementById("tb-status");
    if (!el) return;
    clearTimeout(tbTimer);
    fetch(el.dataset.api, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => {
        if (response.status === 404) return null;
        return response.ok ? response.json() : Promise.reject(response.status);
      })
      .then((data) => {
        el.replaceChildren();
        if (data === null) {
          el.textContent = text.tb_missing;
        } else if (data.active) {
          const link = document.createElement("a");
          link.href = data.url;
          link.textContent = text.tb_active;
          link.id = "tb-link";
          link.target = "_blank";
          link.rel = "noopener";
          el.appendChild(link);
          if (data.signed_url) {
            const signed = document.createElement("a");
            signed.href = data.signed_url;
            signed.textContent = fmt(text.tb_signed, { expires: data.expires_at || "" });
            el.append(" · ", signed);
          }
        } else {
          el.textContent = text.tb_inactive;
          // Issued shortly after the job starts: look again until it is up or the job has ended.
          if (!jobTerminal()) tbTimer = setTimeout(checkTensorBoard, 5000);
        }
      })
      .catch(() => {
        el.textContent = text.tb_missing;
      });
  }

  // Search: the REST search endpoint, shown with line numbers and context.
  const searchForm = document.getElementById("log-search");
  const hitsEl = document.getElementById("log-hits");

  function highlighted(body, query) {
    const row = document.createElement("span");
    row.className = "t";
    const lower = body.toLowerCase();
    const needle = query.toLowerCase();
    let from = 0;
    let at = lower.indexOf(needle);
    while (needle && at !== -1) {
      row.append(body.slice(from, at));
      const mark = document.createElement("mark");
      mark.textContent = body.slice(at, at + needle.length);
      row.append(mark);
      from = at + needle.length;
      at = lower.indexOf(needle, from);
    }
    row.append(body.slice(from));
    return row;
  }

  function renderHits(body, query) {
    hitsEl.replaceChildren();
    const summary = document.createElement("p");
    summary.textContent = body.count ? fmt(text.hits, { count: body.count }) : text.no_hits;
    hitsEl.appendChild(summary);
    for (const hit of body.hits) {
      const box = document.createElement("div");
      box.className = "hit";
      for (const line of hit.before) box.appendChild(lineElement(line.number, line.text));
      const match = lineElement(hit.line.number, "", "match");
      match.replaceChild(highlighted(hit.line.text, query), match.lastChild);
      box.appendChild(match);
      for (const line of hit.after) box.appendChild(lineElement(line.number, line.text));
      hitsEl.appendChild(box);
    }
  }

  searchForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = searchForm.elements.q.value.trim();
    if (!query) return;
    const params = new URLSearchParams({ q: query, context: searchForm.elements.context.value, attempt: String(attempt) });
    hitsEl.textContent = "…";
    fetch(`${panel.dataset.search}?${params}`, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(async (response) => {
        const body = await response.json().catch(() => ({}));
        if (!response.ok) throw new Error(body.detail || String(response.status));
        return body;
      })
      .then((body) => renderHits(body, query))
      .catch((error) => {
        hitsEl.textContent = fmt(text.search_failed, { detail: error.message });
      });
  });

  connect();
  checkTensorBoard();
})();
