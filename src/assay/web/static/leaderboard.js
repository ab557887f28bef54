// Leaderboard pages, enhanced: the pages work without this file.
// - Job page: poll the job's JSON record every 2 s, show its status, models done / total, when a worker
//   started it and the wait in the server's words (gone once a worker has the job), reload once it has
//   finished (the server then renders the links to the scores).
// - Upload form: refuse a file over the upload limit before sending it (the server checks again).
"use strict";

(function () {
  var POLL_MS = 2000;

  function text(id, value) {
    var node = document.getElementById(id);
    if (node) node.textContent = String(value);
  }

  // A moment as the server's pages write it (leaderboard_macros.html ``when``): "2026-11-29 09:41 UTC".
  function utcMinute(iso) {
    var moment = new Date(/(Z|[+-]\d\d:?\d\d)$/.test(iso) ? iso : iso + "Z");
    if (isNaN(moment.getTime())) return iso;
    return moment.toISOString().slice(0, 16).replace("T", " ") + " UTC";
  }

  function followJob(box) {
    var url = box.getAttribute("data-progress-url");
    var live = document.getElementById("job-live");
    if (live) live.hidden = false;

    function show(job) {
      var bar = document.getElementById("job-bar");
      if (bar && job.models_done !== null) {
        bar.max = Math.max(job.models_total, 1);
        bar.value = job.models_done;
      }
      if (job.models_done !== null) text("job-done", job.models_done);
      text("job-total", job.models_total);
      var waiting = document.getElementById("job-queue"); // the server's words for the wait, "" once it runs
      if (waiting) {
        waiting.textContent = job.waiting || "";
        waiting.hidden = !job.waiting;
      }
      var started = document.getElementById("job-started"); // "Started ..." once a worker has claimed it
      if (started && job.claimed_at) {
        text("job-started-at", utcMinute(job.claimed_at));
        started.hidden = false;
      }
      var status = document.getElementById("job-status");
      if (status) {
        status.textContent = job.status;
        status.className = "status status-" + job.status;
      }
    }

    function poll() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          if (!response.ok) throw new Error("HTTP " + response.status);
          return response.json();
        })
        .then(function (job) {
          show(job);
          if (job.finished) window.location.reload();
          else window.setTimeout(poll, POLL_MS);
        })
        .catch(function () {
          window.setTimeout(poll, POLL_MS * 5); // server restarting or offline: try again, more slowly
        });
    }

    window.setTimeout(poll, POLL_MS);
  }

  function guardUpload(form) {
    var limit = Number(form.getAttribute("data-max-bytes"));
    var input = form.querySelector("input[type=file]");
    var message = document.getElementById("archive-too-large");
    if (!input || !message || !limit) return;

    function tooLarge() {
      var file = input.files && input.files[0];
      return file && file.size > limit ? file : null;
    }

    input.addEventListener("change", function () {
      var file = tooLarge();
      message.hidden = !file;
      message.textContent = file
        ? file.name + " is " + (file.size / 1048576).toFixed(1) + " MiB; the limit is " +
          (limit / 1048576).toFixed(1) + " MiB: leave out what the detector does not need to run"
        : "";
    });
    form.addEventListener("submit", function (event) {
      if (tooLarge()) {
        event.preventDefault();
        message.hidden = false;
        input.focus();
      }
    });
  }

  var box = document.getElementById("job-progress");
  if (box && box.getAttribute("data-finished") === "false") followJob(box);
  var form = document.getElementById("upload-form");
  if (form) guardUpload(form);
})();
