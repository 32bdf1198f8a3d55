// Lines over time on one SVG: the frame every time chart of the UI shares (a session's usage on its page, an
// endpoint's traffic on the Endpoints page). Each line has a vertical scale of its own (0..max); overlays (an idle
// threshold) get the frame's y through `overlay(y)`.

/** Where a label sits: the top and bottom of the left axis, the top of a right axis, the first and last time. */
const labelAt = ({ width, height, left, right, top }, y0) => ({
  yMax: { x: left - 4, y: top + 8, "text-anchor": "end", "font-size": 10 },
  yZero: { x: left - 4, y: y0, "text-anchor": "end", "font-size": 10 },
  yMaxRight: { x: width - right + 4, y: top + 8, "font-size": 10 },
  tStart: { x: left, y: height - 4, "font-size": 9 },
  tEnd: { x: width - right, y: height - 4, "text-anchor": "end", "font-size": 9 },
});

/**
 * frame: {width, height, left, right, top, bottom} in SVG units; t0, t1: the time span (ms);
 * lines: [{points: [[t, value]], max, ...attributes of its polyline (class, stroke, data-*)}], a single point drawn
 * as a dot; labels: {yMax, yZero, yMaxRight, tStart, tEnd} as text or [text, colour]; other props go to the <svg>.
 */
export function TimeChart({ frame, t0, t1, lines, labels, overlay, ...svg }) {
  const { width, height, left, right, top, bottom } = frame;
  const x = (t) => left + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (width - left - right);
  const y = (v, max) => top + (1 - v / max) * (height - top - bottom);
  const at = labelAt(frame, y(0, 1));
  return (
    <svg viewBox={`0 0 ${width} ${height}`} role="img" {...svg}>
      <line x1={left} y1={y(0, 1)} x2={width - right} y2={y(0, 1)} stroke="currentColor" stroke-opacity="0.4" />
      {Object.entries(labels).map(([where, label]) => {
        const [text, fill] = Array.isArray(label) ? label : [label];
        return (
          <text key={where} {...at[where]} fill={fill}>
            {text}
          </text>
        );
      })}
      {overlay && overlay(y)}
      {lines.map(({ points, max, ...attributes }, i) =>
        points.length > 1 ? (
          <polyline
            key={i}
            points={points.map(([t, v]) => `${x(t).toFixed(1)},${y(v, max).toFixed(1)}`).join(" ")}
            fill="none"
            stroke-width="1.5"
            {...attributes}
          />
        ) : (
          points.length === 1 && (
            <circle
              key={i}
              class={attributes.class}
              cx={x(points[0][0])}
              cy={y(points[0][1], max)}
              r="2.5"
              fill={attributes.stroke}
            />
          )
        ),
      )}
    </svg>
  );
}
