/* Job list: refresh the state and reason of unfinished jobs every few seconds from a small JSON endpoint. */
(function () {
  "use strict";

  const table = document.querySelector(".jobs-table");
  if (!table) return;
  const url = table.dataset.statesUrl;
  const EVERY_MS = 5000;

  function unfinished() {
    return Array.from(table.querySelectorAll("tr[data-job][data-terminal='0']"));
  }

  function apply(row, info) {
    const badge = row.querySelector("[data-role=state]");
    badge.className = "state state-" + info.state;
    badge.textContent = info.label;
    const reason = row.querySelector("[data-role=reason]");
    reason.textContent = info.state === "pending" ? (info.position ? `#${info.position} · ` : "") + info.reason : "";
    if (info.terminal) row.dataset.terminal = "1";
  }

  function poll() {
    const rows = unfinished();
    if (rows.length === 0) return; // nothing on this page can change any more
    if (document.hidden) {
      setTimeout(poll, EVERY_MS);
      return;
    }
    const params = new URLSearchParams();
    rows.forEach((row) => params.append("id", row.dataset.job));
    fetch(`${url}?${params}`, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
      .then((body) => rows.forEach((row) => body.jobs[row.dataset.job] && apply(row, body.jobs[row.dataset.job])))
      .catch(() => {})
      .finally(() => setTimeout(poll, EVERY_MS));
  }

  setTimeout(poll, EVERY_MS);
})();
