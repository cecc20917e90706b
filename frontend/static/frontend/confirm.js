/* Forms marked data-confirm (cancel a job, cancel several) ask before they are sent. */
(function () {
  "use strict";
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.dataset.confirm) return;
    // A button that sends the form elsewhere (compare the ticked jobs) changes nothing: no question.
    if (event.submitter && event.submitter.hasAttribute("data-no-confirm")) return;
    let message = form.dataset.confirm;
    if (form.dataset.confirmCount) {
      const count = form.querySelectorAll(form.dataset.confirmCount).length;
      if (count === 0) {
        event.preventDefault();
        window.alert(form.dataset.confirmNone);
        return;
      }
      message = message.replace("%(count)s", String(count));
    }
    if (!window.confirm(message)) event.preventDefault();
  });
})();
