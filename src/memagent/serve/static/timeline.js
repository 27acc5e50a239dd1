/* The memory timeline: one row per chunk read (token offset and, for a PDF, HTML or EPUB document, the page,
   chapter or heading it came from; memory after it, what changed, cut flag),
   a click opens the chunk's text (the record's own, or fetched on demand through `options.loadChunk`),
   the final answer with its evidence rows marked.
   Shared by the page at / and by `memagent report` (inlined there). Model and document text is only
   ever set with textContent: nothing it holds is parsed as HTML. */
(function (global) {
  "use strict";

  function words(text) {
    return String(text || "").split(/\s+/).filter(function (w) { return w.length > 0; });
  }

  /* Word diff of two texts as segments [{op: "same" | "add" | "del", text}]: common prefix and suffix,
     then an LCS of the middle (the same split as memagent.timeline.word_diff). */
  function diffWords(oldText, newText) {
    var a = words(oldText), b = words(newText), segs = [];
    var pre = 0, n = Math.min(a.length, b.length);
    while (pre < n && a[pre] === b[pre]) pre++;
    var suf = 0;
    while (suf < n - pre && a[a.length - 1 - suf] === b[b.length - 1 - suf]) suf++;
    var am = a.slice(pre, a.length - suf), bm = b.slice(pre, b.length - suf);
    function push(op, list) {
      if (!list.length) return;
      var last = segs[segs.length - 1];
      if (last && last.op === op) last.text += " " + list.join(" ");
      else segs.push({ op: op, text: list.join(" ") });
    }
    push("same", a.slice(0, pre));
    if (am.length * bm.length > 4000000) {  // too large to align: all removed, all added
      push("del", am); push("add", bm);
    } else {
      var rows = am.length + 1, cols = bm.length + 1, L = new Uint32Array(rows * cols), i, j;
      for (i = am.length - 1; i >= 0; i--)
        for (j = bm.length - 1; j >= 0; j--)
          L[i * cols + j] = am[i] === bm[j] ? L[(i + 1) * cols + j + 1] + 1
            : Math.max(L[(i + 1) * cols + j], L[i * cols + j + 1]);
      i = 0; j = 0;
      while (i < am.length || j < bm.length) {
        if (i < am.length && j < bm.length && am[i] === bm[j]) { push("same", [am[i]]); i++; j++; }
        else if (j < bm.length && (i >= am.length || L[i * cols + j + 1] >= L[(i + 1) * cols + j])) { push("add", [bm[j]]); j++; }
        else { push("del", [am[i]]); i++; }
      }
    }
    push("same", a.slice(a.length - suf));
    return segs;
  }

  /* A row of the contract's shape from a memory trace record and the memory before it. */
  function makeRow(previousMemory, record) {
    var segs = diffWords(previousMemory, record.memory);
    return {
      step: record.step, chunk_start: record.chunk_start, chunk_tokens: record.chunk_tokens,
      memory: String(record.memory || ""), previous_memory: previousMemory || "",
      added: segs.filter(function (s) { return s.op === "add"; }).map(function (s) { return s.text; }),
      removed: segs.filter(function (s) { return s.op === "del"; }).map(function (s) { return s.text; }),
      changed: segs.some(function (s) { return s.op !== "same"; }),
      truncated: !!record.truncated, chunk_text: record.chunk_text == null ? null : String(record.chunk_text),
      source: record.source == null ? null : String(record.source)
    };
  }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text != null) node.textContent = String(text);
    return node;
  }

  function offsetLabel(row) {
    if (row.chunk_start == null) return "";
    var end = row.chunk_tokens == null ? "" : "\u2013" + (row.chunk_start + row.chunk_tokens);
    return "tokens " + row.chunk_start + end + (row.source ? " \u00b7 " + row.source : "");
  }

  /* Where a row's chunk came from, for a person: its page, chapter or heading (a PDF, HTML or EPUB document),
     with the chunk's number; a plain text chunk is its number alone. */
  function placeLabel(row, step) {
    var chunk = "chunk " + (step + 1);
    return row && row.source ? row.source + " (" + chunk + ")" : chunk;
  }

  /* One document's (or question's) timeline inside `container`. `options.loadChunk(row)`: a Promise of the
     text of a row's chunk, for rows whose record holds none (the page asks the service on the first click). */
  function Timeline(container, title, options) {
    this.loadChunk = options && options.loadChunk ? options.loadChunk : null;
    this.root = el("section", "timeline");
    if (title) this.root.appendChild(el("h2", "timeline-title", title));
    this.progress = el("p", "progress");
    this.list = el("ol", "rows");
    this.answerBox = el("div", "answer pending", "No answer yet.");
    this.root.appendChild(this.progress);
    this.root.appendChild(this.list);
    this.root.appendChild(this.answerBox);
    container.appendChild(this.root);
    this.rows = [];
    this.items = {};
    this.evidence = [];
  }

  Timeline.prototype.addRecord = function (record) {
    if (this.items[record.step]) return;  // a replayed event
    var prev = "", k;
    for (k = 0; k < this.rows.length; k++) if (this.rows[k].step < record.step) prev = this.rows[k].memory;
    this.addRow(makeRow(prev, record));
  };

  Timeline.prototype.addRow = function (row) {
    var k = 0;
    while (k < this.rows.length && this.rows[k].step < row.step) k++;
    var item = this.renderRow(row);
    this.list.insertBefore(item, this.list.children[k] || null);
    this.rows.splice(k, 0, row);
    this.items[row.step] = item;
    if (this.evidence.indexOf(row.step) >= 0) item.classList.add("evidence");
  };

  /* A call of a kind other than memory and final (a workflow's own, e.g. a lookup query): kind, step, text. */
  Timeline.prototype.addCall = function (record) {
    var key = "call:" + record.kind + ":" + record.step;
    if (this.items[key]) return;  // a replayed event
    var item = el("li", "row call");
    item.appendChild(el("span", "step", String(record.kind)));
    item.appendChild(el("span", "offset", record.step == null ? "" : "after chunk " + record.step));
    var text = record.text != null ? record.text : record.query != null ? record.query : "";
    item.appendChild(el("div", "memory", String(text)));
    this.list.appendChild(item);
    this.items[key] = item;
  };

  Timeline.prototype.setProgress = function (done, total) {
    this.progress.textContent = total ? "chunk " + done + " of " + total : "chunk " + done;
  };

  Timeline.prototype.renderRow = function (row) {
    var item = el("li", "row" + (row.changed ? " changed" : " unchanged") + (row.truncated ? " cut" : ""));
    item.dataset.step = String(row.step);
    var head = el("button", "row-head");
    head.type = "button";
    head.setAttribute("aria-expanded", "false");
    head.appendChild(el("span", "step", "chunk " + (row.step + 1)));
    head.appendChild(el("span", "offset", offsetLabel(row)));
    head.appendChild(el("span", "flag changed-flag", row.changed ? "changed" : "unchanged"));
    if (row.truncated) head.appendChild(el("span", "flag cut-flag", "cut"));
    item.appendChild(head);
    var memory = el("div", "memory");
    diffWords(row.previous_memory, row.memory).forEach(function (seg) {
      var tag = seg.op === "add" ? "ins" : seg.op === "del" ? "del" : "span";
      memory.appendChild(el(tag, null, seg.text));
      memory.appendChild(document.createTextNode(" "));
    });
    if (!row.memory) memory.appendChild(el("em", "empty", "(empty memory)"));
    item.appendChild(memory);
    var chunk = null, loader = this.loadChunk, loaded = false;  // made on the first click: a long document's
    head.addEventListener("click", function () {                     // chunks stay out of the DOM until asked for
      if (!chunk) {
        chunk = el("pre", "chunk-text", row.chunk_text != null ? row.chunk_text : loader ? "loading the chunk's text ..."
          : "This trace does not hold the chunk's text (ask --trace-chunks writes it).");
        chunk.hidden = true;
        item.appendChild(chunk);
        loaded = row.chunk_text != null || !loader;
      }
      chunk.hidden = !chunk.hidden;
      head.setAttribute("aria-expanded", chunk.hidden ? "false" : "true");
      if (!chunk.hidden && !loaded) {
        loaded = true;
        chunk.classList.add("loading");
        loader(row).then(function (text) {
          chunk.textContent = String(text);
          chunk.classList.remove("loading", "error");
        }, function (e) {
          chunk.textContent = "The chunk's text could not be loaded: " + (e && e.message ? e.message : String(e));
          chunk.classList.remove("loading");
          chunk.classList.add("error");
          loaded = false;  // the next click asks again
        });
      }
    });
    return item;
  };

  Timeline.prototype.setAnswer = function (finalRecord, evidence) {
    var self = this;
    this.evidence = (evidence || []).slice();
    Object.keys(this.items).forEach(function (step) {
      self.items[step].classList.toggle("evidence", self.evidence.indexOf(Number(step)) >= 0);
    });
    var box = this.answerBox;
    box.className = "answer";
    box.textContent = "";
    box.appendChild(el("h3", null, "Answer"));
    var answer = finalRecord.answer;
    box.appendChild(el("p", "answer-text", answer == null ? "(no answer extracted)" : answer));
    if (finalRecord.raw_answer != null && finalRecord.raw_answer !== answer) {
      var raw = el("details", "raw-answer");
      raw.appendChild(el("summary", null, "model reply"));
      raw.appendChild(el("pre", null, finalRecord.raw_answer));
      box.appendChild(raw);
    }
    var ev = el("p", "evidence-list");
    ev.appendChild(el("span", null, this.evidence.length ? "Memory came from: " : "No chunk's words survive in the final memory."));
    var rowOf = {};
    this.rows.forEach(function (row) { rowOf[row.step] = row; });
    this.evidence.forEach(function (step) {
      var link = el("button", "evidence-link", placeLabel(rowOf[step], step));
      link.type = "button";
      link.addEventListener("click", function () {
        var item = self.items[step];
        if (item) item.scrollIntoView({ block: "center" });
      });
      ev.appendChild(link);
    });
    box.appendChild(ev);
  };

  global.MemTimeline = { words: words, diffWords: diffWords, makeRow: makeRow, Timeline: Timeline, el: el };
})(window);
