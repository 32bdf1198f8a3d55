// A kernel's shell in xterm.js over the gateway's terminal WebSocket (first message: the token; never in the URL).
// Loaded only when a terminal is opened, so the sessions page does not ship xterm.
import { useEffect, useRef, useState } from "preact/hooks";
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";
import { getToken } from "./api.js";

export default function KernelTerminal({ sessionId, kernel, onClose }) {
  const host = useRef(null);
  const [state, setState] = useState("connecting");
  useEffect(() => {
    const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 13 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(host.current);
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(
      `${scheme}://${location.host}/sessions/${encodeURIComponent(sessionId)}/kernels/${encodeURIComponent(kernel)}/terminal`,
    );
    ws.binaryType = "arraybuffer";
    const resize = () => {
      fit.fit();
      if (ws.readyState === 1) ws.send(JSON.stringify({ type: "resize", rows: term.rows, cols: term.cols }));
    };
    ws.onopen = () => {
      ws.send(JSON.stringify({ type: "auth", token: getToken() }));
      setState("open");
      resize();
      term.focus();
    };
    ws.onmessage = (m) => {
      if (typeof m.data !== "string") {
        term.write(new Uint8Array(m.data));
        return;
      }
      const msg = JSON.parse(m.data);
      if (msg.type === "exit") {
        setState(`exited (${msg.exitCode})`);
      } else if (msg.type === "error") {
        setState(`${msg.code}: ${msg.message}`);
      }
    };
    ws.onclose = () => setState((s) => (s === "open" || s === "connecting" ? "closed" : s));
    const data = term.onData((d) => ws.readyState === 1 && ws.send(JSON.stringify({ type: "stdin", data: d })));
    addEventListener("resize", resize);
    return () => {
      removeEventListener("resize", resize);
      data.dispose();
      ws.close();
      term.dispose();
    };
  }, [sessionId, kernel]);
  return (
    <div class="terminal">
      <div class="toolbar">
        <strong>Terminal: {kernel}</strong>{" "}
        <span class="muted small" aria-live="polite" id="terminal-state">
          {state}
        </span>
        <button type="button" class="secondary" onClick={onClose}>
          Close terminal
        </button>
      </div>
      <div ref={host} class="xterm-host" aria-label={`Terminal of ${kernel}`} />
    </div>
  );
}
