// The playground: asks POST v1/rag/query with stream: true and renders the server-sent
// events as they arrive. Plain ES2020, no framework, no other host. Everything the server
// sends (answers, titles, passages, error messages) goes into the page as text nodes only:
// retrieved text is untrusted.
"use strict";

(() => {
  const QUERY_URL = "v1/rag/query"; // relative, so a route prefix in front of the app works
  const KEY_STORAGE = "rag-playground.api-key";
  const OPTIONS_STORAGE = "rag-playground.options";
  const OPTION_IDS = [
    "top-k", "compression-method", "compression-rate", "answer-style", "retrieval-query",
    "max-tokens",
  ];

  const byId = (id) => document.getElementById(id);
  const ui = {
    apiKey: byId("api-key"),
    topK: byId("top-k"),
    method: byId("compression-method"),
    rate: byId("compression-rate"),
    answerStyle: byId("answer-style"),
    retrievalQuery: byId("retrieval-query"),
    maxTokens: byId("max-tokens"),
    conversation: byId("conversation"),
    conversationEmpty: byId("conversation-empty"),
    error: byId("error"),
    form: byId("ask-form"),
    question: byId("question"),
    ask: byId("ask"),
    stop: byId("stop"),
    status: byId("status"),
    newConversation: byId("new-conversation"),
    detailsEmpty: byId("details-empty"),
    detailsBody: byId("details-body"),
    figures: byId("figures"),
    retrievalQueryText: byId("retrieval-query-text"),
    degraded: byId("degraded"),
    requestId: byId("request-id"),
    sources: byId("sources"),
  };

  const state = {
    history: [], // completed turns, oldest first: what a follow-up sends as `history`
    exchanges: [], // one per question asked in this conversation
    selected: null, // the exchange whose figures and sources the details panel shows
    controller: null, // aborts the request in flight
  };

  // ---- Server-sent events over fetch (EventSource cannot POST) ----

  /** A line-oriented SSE parser (the WHATWG rules): `push` text as it arrives; each
   * complete event calls `onEvent(name, data)`; comments (": ping") are skipped. */
  function createSseParser(onEvent) {
    let buffer = "";
    let name = "";
    let data = [];
    const line = (text) => {
      if (text === "") {
        if (data.length > 0) onEvent(name || "message", data.join("\n"));
        name = "";
        data = [];
        return;
      }
      if (text.startsWith(":")) return;
      const colon = text.indexOf(":");
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? "" : text.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
    };
    return {
      push(text) {
        buffer += text;
        // A lone trailing "\r" may be the first half of "\r\n": keep it for the next chunk.
        const breaks = /\r\n|\r(?!$)|\n/g;
        let start = 0;
        let match;
        while ((match = breaks.exec(buffer)) !== null) {
          line(buffer.slice(start, match.index));
          start = match.index + match[0].length;
        }
        buffer = buffer.slice(start);
      },
    };
  }

  async function readStream(body, onEvent) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    const parser = createSseParser(onEvent);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.push(decoder.decode(value, { stream: true }));
    }
    parser.push(decoder.decode());
  }

  // ---- The request ----

  function numberOf(input) {
    const text = input.value.trim();
    return text === "" ? null : Number(text);
  }

  function requestBody(question) {
    const body = {
      question,
      history: state.history.map((turn) => ({ role: turn.role, content: turn.content })),
      include_context: true,
      stream: true,
    };
    const topK = numberOf(ui.topK);
    if (topK !== null) body.top_k = topK;
    const rate = numberOf(ui.rate);
    if (ui.method.value || rate !== null) {
      body.compression = {};
      if (ui.method.value) body.compression.method = ui.method.value;
      if (rate !== null) body.compression.rate = rate;
    }
    if (ui.answerStyle.value) body.answer_style = ui.answerStyle.value;
    if (ui.retrievalQuery.value) body.retrieval_query = ui.retrievalQuery.value;
    const maxTokens = numberOf(ui.maxTokens);
    if (maxTokens !== null) body.max_tokens = maxTokens;
    return body;
  }

  async function errorOf(response) {
    let error = null;
    try {
      const body = await response.json();
      error = body && typeof body === "object" ? body.error || null : null;
    } catch (_) {
      // not JSON: a proxy's page, say; the status alone must do
    }
    return {
      status: response.status,
      message: (error && error.message) || response.statusText || "the request failed",
      code: (error && (error.code || error.type)) || `http_${response.status}`,
      retryAfter: response.headers.get("Retry-After"),
    };
  }

  async function ask(question) {
    clearError();
    const exchange = addExchange(question);
    const controller = new AbortController();
    state.controller = controller;
    // A "New conversation" drops this exchange; nothing of its stream may land after that.
    const live = () => state.exchanges.includes(exchange);
    setBusy(true, "Retrieving sources…");
    const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
    const key = ui.apiKey.value.trim();
    if (key) headers.Authorization = `Bearer ${key}`;
    try {
      const response = await fetch(QUERY_URL, {
        method: "POST",
        headers,
        body: JSON.stringify(requestBody(question)),
        signal: controller.signal,
      });
      if (!live()) return;
      if (!response.ok) {
        // Refused before any answer: the question goes back to the box for a retry.
        const error = await errorOf(response);
        dropExchange(exchange);
        ui.question.value = question;
        showError(error);
        setBusy(false, "");
        return;
      }
      const type = response.headers.get("Content-Type") || "";
      if (!type.includes("text/event-stream")) {
        onDone(exchange, await response.json());
      } else {
        let failure = null;
        await readStream(response.body, (name, data) => {
          if (failure || data === "[DONE]" || !live()) return;
          let payload;
          try {
            payload = JSON.parse(data);
          } catch (_) {
            failure = { message: `the service sent a malformed '${name}' event`, code: "bad_event" };
            return;
          }
          if (name === "sources") onSources(exchange, payload);
          else if (name === "delta") onDelta(exchange, payload);
          else if (name === "citations") exchange.citations = listOf(payload && payload.citations);
          else if (name === "done") onDone(exchange, payload);
          else if (name === "error") failure = errorFromEvent(payload);
        });
        if (!live()) return;
        if (failure) onFailure(exchange, failure);
        else if (!exchange.done) {
          onFailure(exchange, {
            message: "the stream ended before the answer was complete",
            code: "stream_incomplete",
          });
        }
      }
    } catch (err) {
      if (!live()) return;
      if (err && err.name === "AbortError") {
        onStopped(exchange);
      } else if (exchange.started) {
        onFailure(exchange, { message: `the stream broke: ${err}`, code: "network_error" });
      } else {
        dropExchange(exchange);
        ui.question.value = question;
        showError({ message: `could not reach the service: ${err}`, code: "network_error" });
        setBusy(false, "");
      }
    } finally {
      if (state.controller === controller) state.controller = null;
      if (!state.controller) setBusy(false);
    }
  }

  function errorFromEvent(payload) {
    const error = (payload && payload.error) || payload || {};
    return {
      message: error.message || "the service failed while answering",
      code: error.code || error.type || "stream_error",
    };
  }

  // ---- Stream events ----

  function onSources(exchange, payload) {
    exchange.started = true;
    exchange.sourcesEvent = payload || {};
    setBusy(true, "Generating…");
    if (state.selected === exchange) renderDetails(exchange);
  }

  function onDelta(exchange, payload) {
    const text = payload && typeof payload.text === "string" ? payload.text : "";
    if (!text) return;
    exchange.started = true;
    exchange.streamed += text;
    exchange.view.answer.append(text); // a text node
    exchange.view.turn.dataset.state = "streaming";
  }

  function onDone(exchange, payload) {
    const done = payload || {};
    exchange.started = true;
    exchange.done = done;
    if (Array.isArray(done.citations)) exchange.citations = done.citations;
    exchange.answer = typeof done.answer === "string" ? done.answer : exchange.streamed;
    renderAnswer(exchange);
    exchange.view.turn.dataset.state = "done";
    exchange.view.meta.textContent = turnSummary(done);
    state.history.push(
      { role: "user", content: exchange.question },
      { role: "assistant", content: exchange.answer },
    );
    const total = done.timings_ms && done.timings_ms.total;
    setBusy(true, typeof total === "number" ? `Answered in ${formatMs(total)}.` : "Answered.");
    if (state.selected === exchange) renderDetails(exchange);
  }

  function onFailure(exchange, error) {
    if (exchange.done) return; // the answer is complete and in the history already
    exchange.ended = true;
    exchange.view.turn.dataset.state = "error";
    exchange.view.answer.classList.add("interrupted");
    exchange.view.meta.textContent = exchange.streamed
      ? "Interrupted: this partial text is not an answer and is not kept in the conversation."
      : "No answer.";
    showError(error);
    setBusy(false, "");
    if (state.selected === exchange) renderDetails(exchange);
  }

  function onStopped(exchange) {
    if (exchange.done) return;
    exchange.ended = true;
    exchange.view.turn.dataset.state = "stopped";
    exchange.view.answer.classList.add("interrupted");
    exchange.view.meta.textContent = "Stopped: not kept in the conversation.";
    setBusy(false, "Stopped.");
    if (state.selected === exchange) renderDetails(exchange);
  }

  // ---- The conversation ----

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function addExchange(question) {
    ui.conversationEmpty.hidden = true;
    const user = element("li", "turn user");
    user.dataset.testid = "turn-user";
    user.append(element("div", "role", "You"), element("div", "text", question));

    const turn = element("li", "turn assistant");
    turn.dataset.testid = "turn-assistant";
    turn.dataset.state = "waiting";
    turn.tabIndex = 0;
    const answer = element("div", "answer");
    answer.dataset.testid = "answer";
    const meta = element("div", "turn-meta");
    meta.dataset.testid = "turn-meta";
    turn.append(element("div", "role", "Assistant"), answer, meta);

    const exchange = {
      question,
      streamed: "",
      answer: "",
      started: false,
      ended: false, // failed or stopped
      sourcesEvent: null,
      done: null,
      citations: [],
      view: { user, turn, answer, meta },
    };
    turn.addEventListener("click", () => select(exchange));
    turn.addEventListener("focus", () => select(exchange));
    ui.conversation.append(user, turn);
    state.exchanges.push(exchange);
    select(exchange);
    turn.scrollIntoView({ block: "nearest" });
    return exchange;
  }

  function dropExchange(exchange) {
    exchange.view.user.remove();
    exchange.view.turn.remove();
    state.exchanges = state.exchanges.filter((other) => other !== exchange);
    ui.conversationEmpty.hidden = state.exchanges.length > 0;
    select(state.exchanges[state.exchanges.length - 1] || null);
  }

  function newConversation() {
    if (state.controller) state.controller.abort();
    state.controller = null;
    state.history = [];
    state.exchanges = [];
    for (const node of Array.from(ui.conversation.querySelectorAll(".turn"))) node.remove();
    ui.conversationEmpty.hidden = false;
    clearError();
    select(null);
    setBusy(false, "");
    ui.question.focus();
  }

  function select(exchange) {
    state.selected = exchange;
    for (const other of state.exchanges) {
      other.view.turn.classList.toggle("selected", other === exchange);
    }
    renderDetails(exchange);
  }

  function turnSummary(done) {
    const parts = [];
    const timings = done.timings_ms || {};
    const usage = done.usage || {};
    if (typeof timings.total === "number") parts.push(formatMs(timings.total));
    if (typeof usage.completion_tokens === "number") {
      parts.push(`${usage.completion_tokens} tokens`);
    }
    if (done.finish_reason && done.finish_reason !== "stop") {
      parts.push(`finish: ${done.finish_reason}`);
    }
    const cited = listOf(done.citations).length;
    if (cited) parts.push(`${cited} citation${cited === 1 ? "" : "s"}`);
    return parts.join(" · ");
  }

  // ---- Citations: spans are [start, end) offsets in code points (Python's str) ----

  function listOf(value) {
    return Array.isArray(value) ? value : [];
  }

  function spanOf(value, length) {
    if (!Array.isArray(value) || value.length !== 2) return null;
    const start = Math.max(0, Math.min(length, Math.floor(Number(value[0]))));
    const end = Math.max(0, Math.min(length, Math.floor(Number(value[1]))));
    return Number.isFinite(start) && Number.isFinite(end) && end > start ? [start, end] : null;
  }

  /** Cut `chars` (an array of code points) at every span edge; each piece lists the
   * indexes of the spans covering it. `spans` holds {start, end, index}. */
  function pieces(chars, spans) {
    const edges = new Set([0, chars.length]);
    for (const span of spans) {
      edges.add(span.start);
      edges.add(span.end);
    }
    const cuts = Array.from(edges).sort((a, b) => a - b);
    const result = [];
    for (let i = 0; i + 1 < cuts.length; i += 1) {
      const [start, end] = [cuts[i], cuts[i + 1]];
      const cover = spans.filter((s) => s.start <= start && end <= s.end).map((s) => s.index);
      result.push({ start, end, text: chars.slice(start, end).join(""), cover });
    }
    return result;
  }

  function sourcesOf(exchange) {
    if (exchange.done && Array.isArray(exchange.done.sources)) return exchange.done.sources;
    return listOf(exchange.sourcesEvent && exchange.sourcesEvent.sources);
  }

  function renderAnswer(exchange) {
    const chars = Array.from(exchange.answer);
    const ranks = new Map(sourcesOf(exchange).map((source, i) => [source.id, i + 1]));
    const spans = [];
    exchange.citations.forEach((citation, index) => {
      const span = citation && spanOf(citation.answer_span, chars.length);
      if (span) spans.push({ start: span[0], end: span[1], index });
    });
    const nodes = [];
    for (const piece of pieces(chars, spans)) {
      if (piece.cover.length === 0) {
        nodes.push(document.createTextNode(piece.text));
      } else {
        const cited = element("span", "cited", piece.text);
        cited.dataset.citations = piece.cover.join(" ");
        cited.dataset.testid = "answer-citation";
        linkCitation(exchange, cited, piece.cover, false);
        nodes.push(cited);
      }
      for (const span of spans) {
        if (span.end !== piece.end) continue;
        const citation = exchange.citations[span.index];
        // The label is CSS generated content, so the answer's text stays the answer.
        const rank = ranks.get(citation.source_id) || "?";
        const ref = element("button", "cite-ref");
        ref.type = "button";
        ref.dataset.rank = String(rank);
        ref.dataset.citations = String(span.index);
        ref.title = `Supported by source ${rank} (${citation.source_id})`;
        ref.setAttribute("aria-label", `source ${rank}`);
        linkCitation(exchange, ref, [span.index], true);
        nodes.push(ref);
      }
    }
    exchange.view.answer.replaceChildren(...nodes);
  }

  function linkCitation(exchange, node, indexes, focusable) {
    const on = () => {
      if (state.selected !== exchange) select(exchange);
      highlight(exchange, indexes);
    };
    node.addEventListener("mouseenter", on);
    node.addEventListener("mouseleave", () => highlight(exchange, []));
    if (focusable) {
      node.addEventListener("focus", on);
      node.addEventListener("blur", () => highlight(exchange, []));
    }
    node.addEventListener("click", (event) => {
      event.stopPropagation();
      on();
      const mark = ui.sources.querySelector("mark.active");
      if (mark) mark.scrollIntoView({ block: "nearest", behavior: "smooth" });
    });
  }

  function highlight(exchange, indexes) {
    const wanted = new Set(indexes.map(String));
    const covers = (node) => (node.dataset.citations || "").split(" ").some((i) => wanted.has(i));
    for (const node of exchange.view.answer.querySelectorAll("[data-citations]")) {
      node.classList.toggle("active", covers(node));
    }
    if (state.selected !== exchange) return;
    for (const node of ui.sources.querySelectorAll("mark[data-citations]")) {
      node.classList.toggle("active", covers(node));
    }
  }

  // ---- The details panel: figures and sources ----

  function formatMs(value) {
    if (typeof value !== "number" || !Number.isFinite(value)) return "–";
    if (value >= 10000) return `${(value / 1000).toFixed(1)} s`;
    return `${value.toFixed(value < 100 ? 1 : 0)} ms`;
  }

  function formatCount(value) {
    return typeof value === "number" && Number.isFinite(value) ? String(value) : "–";
  }

  // "system 256 · passages 160": the parts of the prompt the cached tokens came from.
  function formatSegments(segments) {
    if (!segments || typeof segments !== "object") return "–";
    const parts = ["system", "history", "passages", "question"]
      .filter((name) => typeof segments[name] === "number" && segments[name] > 0)
      .map((name) => `${name} ${segments[name]}`);
    return parts.length ? parts.join(" · ") : "none";
  }

  function setFigure(name, text) {
    ui.figures.querySelector(`[data-testid="figure-${name}"]`).textContent = text;
  }

  function renderDetails(exchange) {
    ui.detailsEmpty.hidden = Boolean(exchange);
    ui.detailsBody.hidden = !exchange;
    if (!exchange) return;
    const head = exchange.sourcesEvent || {};
    const done = exchange.done || {};
    const usage = done.usage || {};
    const timings = done.timings_ms || {};
    const before = usage.context_tokens_before ?? head.context_tokens_before;
    const after = usage.context_tokens_after ?? head.context_tokens_after;
    ui.figures.dataset.state = exchange.done ? "done" : exchange.sourcesEvent ? "partial" : "pending";
    setFigure("context-tokens-before", formatCount(before));
    const kept = typeof before === "number" && typeof after === "number" && before > 0
      ? ` (${Math.round((100 * after) / before)}%)` : "";
    setFigure("context-tokens-after", `${formatCount(after)}${kept}`);
    setFigure("compression-method", done.compression_method || head.compression_method || "–");
    setFigure("prompt-tokens", formatCount(usage.prompt_tokens));
    setFigure("cached-tokens", formatCount(usage.cached_prompt_tokens));
    setFigure("cached-segments", formatSegments(usage.cached_prompt_tokens_by_segment));
    setFigure("completion-tokens", formatCount(usage.completion_tokens));
    for (const name of ["retrieve", "compress", "rewrite", "attribute", "queue", "network",
      "ttft", "total"]) {
      setFigure(`${name}-ms`, formatMs(timings[name]));
    }
    setFigure("tpot-ms", formatMs(done.tpot_ms));
    setFigure("finish-reason", done.finish_reason || "–");

    const query = done.retrieval_query || head.retrieval_query;
    ui.retrievalQueryText.textContent = query && query.text
      ? `Searched for (${query.mode || "?"}${query.rewrite_failed ? ", rewrite failed" : ""}): `
        + `“${query.text}”`
      : "";
    const degraded = done.degraded || head.degraded;
    ui.degraded.hidden = !degraded;
    ui.degraded.textContent = degraded ? `Sent uncompressed: ${degraded}` : "";
    const id = done.id || head.id;
    ui.requestId.textContent = id ? `Request ${id}` : "";
    renderSources(exchange);
  }

  function renderSources(exchange) {
    const passages = new Map(
      listOf(exchange.done && exchange.done.context)
        .filter((passage) => passage && typeof passage.text === "string")
        .map((passage) => [passage.id, passage.text]),
    );
    const items = sourcesOf(exchange).map((source, i) => {
      const item = element("li", "source");
      item.dataset.testid = "source";
      item.dataset.sourceId = String(source.id);
      const head = element("div", "source-head");
      head.append(element("span", "source-rank", i + 1));
      const title = element("span", "source-title", source.title || source.doc_id || source.id);
      title.dataset.testid = "source-title";
      const score = element(
        "span", "source-score", typeof source.score === "number" ? source.score.toFixed(3) : "–",
      );
      score.dataset.testid = "source-score";
      score.title = "retrieval score";
      head.append(title, score);
      item.append(head, element("div", "source-id", source.id));
      const passage = element("p", "passage");
      passage.dataset.testid = "source-passage";
      if (passages.has(source.id)) {
        fillPassage(exchange, passage, source.id, passages.get(source.id));
      } else {
        passage.classList.add("pending");
        if (exchange.done) passage.textContent = "(the service did not return this passage)";
        else if (exchange.ended) passage.textContent = "(no passage: the answer did not complete)";
        else passage.textContent = "(the passage shows when the answer is complete)";
      }
      item.append(passage);
      return item;
    });
    ui.sources.replaceChildren(...items);
  }

  function fillPassage(exchange, passage, sourceId, text) {
    const chars = Array.from(text);
    const spans = [];
    exchange.citations.forEach((citation, index) => {
      if (!citation || citation.source_id !== sourceId) return;
      const span = spanOf(citation.source_span, chars.length);
      if (span) spans.push({ start: span[0], end: span[1], index });
    });
    const nodes = pieces(chars, spans).map((piece) => {
      if (piece.cover.length === 0) return document.createTextNode(piece.text);
      const mark = element("mark", "", piece.text);
      mark.dataset.testid = "citation-mark";
      mark.dataset.citations = piece.cover.join(" ");
      mark.addEventListener("mouseenter", () => highlight(exchange, piece.cover));
      mark.addEventListener("mouseleave", () => highlight(exchange, []));
      return mark;
    });
    passage.replaceChildren(...nodes);
  }

  // ---- Page state ----

  function setBusy(busy, status) {
    const inFlight = busy && state.controller !== null;
    ui.ask.disabled = inFlight;
    ui.stop.hidden = !inFlight;
    if (status !== undefined) ui.status.textContent = status;
  }

  function showError(error) {
    const code = [error.status, error.code].filter(Boolean).join(" ");
    const label = element("strong", "error-code", code || "error");
    label.dataset.testid = "error-code";
    const message = element("span", "error-message", error.message);
    message.dataset.testid = "error-message";
    const nodes = [label, document.createTextNode(" "), message];
    if (error.retryAfter) nodes.push(element("span", "error-hint", ` Retry after ${error.retryAfter} s.`));
    if (error.status === 401) nodes.push(element("span", "error-hint", " Check the API key."));
    ui.error.replaceChildren(...nodes);
    ui.error.hidden = false;
  }

  function clearError() {
    ui.error.hidden = true;
    ui.error.replaceChildren();
  }

  function saveOptions() {
    const values = {};
    for (const id of OPTION_IDS) values[id] = byId(id).value;
    try {
      sessionStorage.setItem(OPTIONS_STORAGE, JSON.stringify(values));
    } catch (_) {
      // storage off (private mode): the options simply are not kept
    }
  }

  function restore() {
    try {
      ui.apiKey.value = sessionStorage.getItem(KEY_STORAGE) || "";
      const values = JSON.parse(sessionStorage.getItem(OPTIONS_STORAGE) || "{}");
      for (const id of OPTION_IDS) {
        if (typeof values[id] === "string") byId(id).value = values[id];
      }
    } catch (_) {
      // nothing kept, or storage off
    }
  }

  /** The compression methods the service accepts, from its OpenAPI document (the schema
   * lists prepare.methods' registry); the menu keeps only "service default" without it. */
  async function loadMethods() {
    try {
      const response = await fetch("openapi.json", { headers: { Accept: "application/json" } });
      if (!response.ok) return;
      const schema = await response.json();
      const field = schema.components.schemas.CompressionOptions.properties.method;
      const names = (field.anyOf || [field]).flatMap((option) => option.enum || []);
      for (const name of names) {
        if (typeof name !== "string") continue;
        const option = document.createElement("option");
        option.value = name;
        option.textContent = name;
        ui.method.append(option);
      }
    } catch (_) {
      // no document (or another shape): requests use the service's default method
    }
  }

  function submit() {
    const question = ui.question.value.trim();
    if (!question) {
      ui.status.textContent = "Type a question first.";
      ui.question.focus();
      return;
    }
    if (state.controller) return; // one question at a time
    ui.question.value = "";
    ask(question);
  }

  // Restored once the menu holds the methods, so a kept choice finds its option.
  loadMethods().then(restore, restore);
  ui.apiKey.addEventListener("input", () => {
    try {
      sessionStorage.setItem(KEY_STORAGE, ui.apiKey.value);
    } catch (_) {
      // storage off: the key lasts as long as the page
    }
  });
  for (const id of OPTION_IDS) byId(id).addEventListener("change", saveOptions);
  byId("settings-form").addEventListener("submit", (event) => event.preventDefault());
  ui.form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });
  ui.question.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      submit();
    }
  });
  ui.stop.addEventListener("click", () => {
    if (state.controller) state.controller.abort();
  });
  ui.newConversation.addEventListener("click", newConversation);
  renderDetails(null);
})();
