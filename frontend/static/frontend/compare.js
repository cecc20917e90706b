// Compare runs: sort the final-metrics table by a column (numbers as numbers, empty cells last).
(function () {
  "use strict";
  const table = document.getElementById("final-metrics");
  if (!table) return;
  const body = table.tBodies[0];
  table.querySelectorAll("thead button[data-sort]").forEach(function (button) {
    button.addEventListener("click", function () {
      const th = button.closest("th");
      const index = Array.prototype.indexOf.call(th.parentNode.children, th);
      const numeric = button.dataset.sort === "number";
      const ascending = th.getAttribute("aria-sort") !== "ascending";
      table.querySelectorAll("thead th").forEach(function (other) { other.setAttribute("aria-sort", "none"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      const rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        const x = a.cells[index].dataset.value || "";
        const y = b.cells[index].dataset.value || "";
        if (x === "" || y === "") return x === y ? 0 : (x === "" ? 1 : -1);
        const order = numeric ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
        return ascending ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
})();
