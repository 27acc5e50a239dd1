/* The page at /: upload or paste a document, ask questions, start a job on the service and fill each
   question's timeline live from GET /v1/jobs/{id}/events (SSE read with fetch, so an API key can be sent).
   Text from the document or the model is set with textContent only (timeline.js). */
(function () {
  "use strict";
  var $ = function (id) { return document.getElementById(id); };
  var job = null, timelines = [], abort = null, ended = false;

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

  function resetTimelines(questions) {
    $("timelines").textContent = "";
    timelines = questions.map(function (q, i) {
      return new MemTimeline.Timeline($("timelines"), (questions.length > 1 ? "Q" + (i + 1) + ": " : "") + q);
    });
  }

  function timelineFor(index) {
    while (timelines.length <= index) timelines.push(new MemTimeline.Timeline($("timelines"), "Question " + (timelines.length + 1)));
    return timelines[index];
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
      if (done) { ended = true; finish(); }
    }
  }

  /* Parse a text/event-stream body: blocks separated by a blank line, `event:` and `data:` lines. */
  async function follow(jobId) {
    abort = new AbortController();
    ended = false;
    var res = await fetch("/v1/jobs/" + encodeURIComponent(jobId) + "/events",
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
      history.replaceState(null, "", "#job=" + encodeURIComponent(job.id));
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

  /* Opened as /#job=job_<hex>: show that job's timeline (events already past are replayed). */
  async function resume() {
    var m = /^#job=(job_[0-9a-f]+)$/.exec(location.hash);
    if (!m) return;
    job = { id: m[1] };
    $("start").disabled = true;
    try {
      var info = await call("GET", "/v1/jobs/" + m[1]);
      resetTimelines((info.questions || []).map(function (q) { return q.question; }));
      $("cancel").disabled = false;
      await follow(m[1]);
    } catch (e) {
      setStatus("error: " + e.message, true);
    } finally {
      finish();
    }
  }

  $("ask-form").addEventListener("submit", start);
  $("cancel").addEventListener("click", cancel);
  resume();
})();
