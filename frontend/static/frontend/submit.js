/* Submit form: say which queues the team may use and which specs the chosen queue offers; show the GPU
   count only for whole-card specs. The server checks all of it again. */
(function () {
  "use strict";

  const form = document.querySelector(".submit-form");
  if (!form) return;
  const team = form.querySelector("#id_team");
  const gpusField = form.querySelector("#field-gpus");
  const gpusInput = form.querySelector("#id_gpus");
  const timeoutHint = form.querySelector("[data-role=timeout-hint]");

  function chosen(name) {
    const radio = form.querySelector(`input[name=${name}]:checked`);
    return radio ? radio.closest(".choice") : null;
  }

  function update() {
    form.querySelectorAll("[data-queue]").forEach((queue) => {
      queue.querySelector(".queue-team-note").hidden = !team || queue.dataset.teams.split(" ").includes(team.value);
    });
    const queue = chosen("queue");
    const offered = queue ? queue.dataset.specs.split(" ") : null;
    form.querySelectorAll("[data-spec]").forEach((spec) => {
      const ok = !offered || offered.includes(spec.dataset.spec);
      spec.classList.toggle("is-unavailable", !ok);
      spec.querySelector(".spec-queue-note").hidden = ok;
    });
    const spec = chosen("spec");
    const whole = spec !== null && spec.dataset.exclusive === "1";
    gpusField.hidden = !whole && !gpusInput.getAttribute("aria-invalid");
    gpusInput.disabled = gpusField.hidden;
    timeoutHint.textContent = queue ? timeoutHint.dataset.template.replace("{max}", queue.dataset.maxTimeout) : "";
  }

  form.addEventListener("change", update);
  update();
  const summary = document.getElementById("error-summary");
  if (summary) summary.focus();
})();
