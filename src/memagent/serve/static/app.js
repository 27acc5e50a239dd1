/* The page at /: upload or paste a document, ask questions, start a job on the service and fill each
   question's timeline live from GET /v1/jobs/{id}/events (SSE read with fetch, so an API key can be sent).
   The server's recent jobs (GET /v1/jobs, those started through the API too) are listed; each opens by its
   link, /?job=ID (one can share it). A chunk's text is fetched when its row is clicked
   (GET /v1/jobs/{id}/chunks/{k}): the event stream is asked without it. Text from the document or the model
   is set with textContent only (timeline.js). */
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var job = null, timelines = [], abort = null, ended = false;
  var JOB_ID = /^job_[0-9a-f]{1,64}$/, KEY = "memagent-api-key";

  try { $("api-key").value = sessionStorage.getItem(KEY) || ""; } catch (e) { /* storage off: type it again */ }
  $("api-key").addEventListener("change", function () {
    try { sessionStorage.setItem(KEY, $("api-key").value.trim()); } catch (e) { /* storage off */ }
  });

  function headers(extra) {
    var h = Object.assign({}, extra || {}), key = $("api-key").value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  function setStatus(text, isError) {
    $("status").textContent = text;
    $("status").className = isError ? "error" : "";
  }

  async function call(method, path, body, contentType) {
    var init = { method: method, headers: headers(contentType ? { "Content-Type": contentType } : {}) };
    if (body !== undefined) init.body = body;
    var res = await fetch(path, init);
    if (!res.ok) throw new Error(await errorOf(res));
    return res.json();
  }

  /* The service's message of a failed response ({"error": {"message"}}), else its status line. */
  async function errorOf(res) {
    var data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    return data && data.error && data.error.message ? data.error.message : res.status + " " + res.statusText;
  }

  function questionsOf() {
    return $("questions").value.split("\n").map(function (q) { return q.trim(); }).filter(Boolean);
  }

  function jobPath(id, rest) { return "/v1/jobs/" + encodeURIComponent(id) + (rest || ""); }

  /* The text of a row's chunk, from what the server kept for the job (the row's `step` is its chunk number). */
  function loadChunk(row) {
    if (!job) return Promise.reject(new Error("no job is open"));
    return call("GET", jobPath(job.id, "/chunks/" + encodeURIComponent(row.step))).then(function (c) { return c.text; });
  }

  function newTimeline(title) { return new MemTimeline.Timeline($("timelines"), title, { loadChunk: loadChunk }); }

  function resetTimelines(questions) {
    $("timelines").textContent = "";
    timelines = questions.map(function (q, i) {
      return newTimeline((questions.length > 1 ? "Q" + (i + 1) + ": " : "") + q);
    });
  }

  function timelineFor(index) {
    while (timelines.length <= index) timelines.push(newTimeline("Question " + (timelines.length + 1)));
    return timelines[index];
  }

  /* The open job's line: its id, workflow and state, and its link. */
  function showMeta(info) {
    var meta = $("job-meta"), link = MemTimeline.el("a", "job-share", location.origin + "/?job=" + info.id);
    link.href = "/?job=" + encodeURIComponent(info.id);
    meta.textContent = "";
    meta.appendChild(document.createTextNode("job " + info.id + " \u00b7 workflow " + (info.workflow || "(not recorded)") +
                                             " \u00b7 " + info.state + " \u00b7 link: "));
    meta.appendChild(link);
    meta.hidden = false;
  }

  /* The server's recent jobs, newest first; each a link that opens it. */
  async function loadJobs() {
    var list = $("job-list"), el = MemTimeline.el;
    try {
      var data = (await call("GET", "/v1/jobs?limit=20")).data || [];
      list.textContent = "";
      $("jobs-status").textContent = data.length ? "" : "no jobs yet";
      $("jobs-status").className = "";
      data.forEach(function (j) {
        var item = el("li", "job-item" + (job && job.id === j.id ? " current" : ""));
        item.dataset.job = j.id;
        var link = el("a", "job-link", (j.question == null ? "(no question)" : j.question) +
                      (j.questions > 1 ? " (+" + (j.questions - 1) + " more)" : ""));
        link.href = "/?job=" + encodeURIComponent(j.id);
        link.title = j.id;
        item.appendChild(link);
        item.appendChild(el("span", "job-state " + j.state, j.state + (j.chat ? " (chat)" : "")));
        item.appendChild(el("span", "job-workflow", j.workflow || "-"));
        item.appendChild(el("span", "job-time", new Date(j.created * 1000).toLocaleString()));
        list.appendChild(item);
      });
    } catch (e) {
      $("jobs-status").textContent = "cannot list the jobs: " + e.message;
      $("jobs-status").className = "error";
    }
  }

  function onEvent(name, data) {
    var t;
    if (name === "step" && data.kind && data.kind !== "memory") {  // a call of a workflow's own kind (open set)
      timelineFor(data.question_index || 0).addCall(data);
      setStatus("reading: " + data.kind);
    } else if (name === "step") {
      t = timelineFor(data.question_index || 0);
      t.addRecord(data);
      t.setProgress(data.step + 1, data.chunks_total);
      setStatus("reading: chunk " + (data.step + 1) + (data.chunks_total ? " of " + data.chunks_total : ""));
    } else if (name === "answer") {
      timelineFor(data.question_index || 0).setAnswer(data, data.evidence);
    } else if (name === "state") {
      var done = ["done", "failed", "cancelled"].indexOf(data.state) >= 0;
      setStatus(data.state + (data.error ? ": " + data.error : ""), data.state === "failed");
      if (done) { ended = true; finish(); loadJobs(); }
      if (job && job.info) { job.info.state = data.state; showMeta(job.info); }
    }
  }

  /* Parse a text/event-stream body: blocks separated by a blank line, `event:` and `data:` lines. */
  async function follow(jobId) {
    abort = new AbortController();
    ended = false;
    var res = await fetch(jobPath(jobId, "/events?chunk_text=0"),
                          { headers: headers({ Accept: "text/event-stream" }), signal: abort.signal });
    if (!res.ok || !res.body) throw new Error(await errorOf(res));
    var reader = res.body.getReader(), decoder = new TextDecoder(), buf = "";
    for (;;) {
      var chunk = await reader.read();
      if (chunk.done) break;
      buf += decoder.decode(chunk.value, { stream: true }).replace(/\r\n?/g, "\n");
      var cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        var block = buf.slice(0, cut), name = "message", data = [];
        buf = buf.slice(cut + 2);
        block.split("\n").forEach(function (line) {
          if (line.indexOf("event:") === 0) name = line.slice(6).trim();
          else if (line.indexOf("data:") === 0) data.push(line.slice(5).replace(/^ /, ""));
        });
        if (data.length) onEvent(name, JSON.parse(data.join("\n")));
      }
    }
    if (!ended) setStatus("the event stream ended before the job did; reload the page to follow it again", true);
  }

  function finish() {
    $("start").disabled = false;
    $("cancel").disabled = true;
  }

  async function start(ev) {
    ev.preventDefault();
    var questions = questionsOf(), file = $("doc-file").files[0], text = $("doc-text").value;
    if (!questions.length) { setStatus("Type at least one question.", true); return; }
    if (!file && !text.trim()) { setStatus("Upload a file or paste a document.", true); return; }
    $("start").disabled = true;
    try {
      var body = { questions: questions };
      if (file) {
        setStatus("uploading " + file.name + " ...");
        var doc = await call("POST", "/v1/documents", file, "application/octet-stream");
        body.document_id = doc.id;
      } else {
        body.document = text;
      }
      resetTimelines(questions);
      job = await call("POST", "/v1/jobs", JSON.stringify(body), "application/json");
      history.replaceState(null, "", "/?job=" + encodeURIComponent(job.id));
      job.info = await call("GET", jobPath(job.id));
      showMeta(job.info);
      loadJobs();
      $("cancel").disabled = false;
      setStatus("queued");
      await follow(job.id);
    } catch (e) {
      if (e.name !== "AbortError") setStatus("error: " + e.message, true);
    } finally {
      finish();
    }
  }

  async function cancel() {
    if (!job) return;
    try { await call("DELETE", "/v1/jobs/" + encodeURIComponent(job.id)); }
    catch (e) { setStatus("error: " + e.message, true); }
  }

  /* The job id the page was opened with: /?job=ID (the link), or the older /#job=ID. */
  function linkedJob() {
    var id = new URLSearchParams(location.search).get("job");
    if (id == null) {
      var m = /^#job=(.*)$/.exec(location.hash);
      id = m ? decodeURIComponent(m[1]) : null;
    }
    return id;
  }

  /* Opened by a job's link: show its timeline as for a job started here (events already past are replayed). */
  async function resume() {
    var id = linkedJob();
    if (id == null) return;
    if (!JOB_ID.test(id)) { setStatus("error: the link's job id is not one (job_ then hex digits)", true); return; }
    job = { id: id };
    $("start").disabled = true;
    try {
      var info = await call("GET", jobPath(id));
      job.info = info;
      showMeta(info);
      resetTimelines((info.questions || []).map(function (q) { return q.question; }));
      $("cancel").disabled = ["done", "failed", "cancelled"].indexOf(info.state) >= 0;
      await follow(id);
    } catch (e) {
      setStatus("error: " + e.message, true);
    } finally {
      finish();
    }
  }

  $("ask-form").addEventListener("submit", start);
  $("cancel").addEventListener("click", cancel);
  $("refresh-jobs").addEventListener("click", loadJobs);
  resume();  // sets the linked job before its first await, so the list marks it
  loadJobs();
})();
