// Live updates: ONE event stream per page, multiplexed. A browser allows
// six HTTP/1.1 connections per origin; a stream per panel would use them
// up and leave the API calls hanging. The page says what it watches (a
// workflow, some event kinds); the stream is reopened with those filters
// when that changes, so there is never more than one.
//
// `GET /events` sends `snapshot` first, then `change` per engine event,
// and `resync` when it lost events: on `snapshot` and `resync` the page
// re-reads its state over REST. Without the stream (an older service, a
// proxy that cuts it), the page re-reads every two seconds instead, and
// tries the stream again now and then.

const POLL_MS = 2000;
const RETRY_MS = [5000, 15000, 60000];

export class Live {
  constructor(onMode = () => {}) {
    this.onMode = onMode;
    this.source = null;
    this.handler = null;
    this.filters = '';
    this.pollTimer = null;
    this.retryTimer = null;
    this.failures = 0;
    this.mode = 'off';
  }

  /**
   * Watch events for the current page. `filters`: `{workflow, kind}`;
   * `handler`: `{change(event), refresh()}`. Replaces what was watched.
   */
  watch(filters, handler) {
    this.handler = handler;
    const params = new URLSearchParams();
    if (filters.workflow) params.set('workflow', filters.workflow);
    if (filters.kind) params.set('kind', filters.kind.join(','));
    const text = params.toString();
    if (text !== this.filters || !this.source) {
      this.filters = text;
      this.failures = 0;
      this.open();
    }
  }

  /** Stop watching (the page is going away). */
  stop() {
    this.handler = null;
    clearTimeout(this.retryTimer);
    this.close();
    this.stopPolling();
    this.setMode('off');
  }

  open() {
    this.close();
    clearTimeout(this.retryTimer);
    const url = `/events${this.filters ? `?${this.filters}` : ''}`;
    const source = new EventSource(url);
    this.source = source;
    source.addEventListener('open', () => {
      this.failures = 0;
      this.stopPolling();
      this.setMode('live');
    });
    source.addEventListener('snapshot', () => this.handler?.refresh());
    source.addEventListener('resync', () => this.handler?.refresh());
    source.addEventListener('change', (message) => {
      let event;
      try {
        event = JSON.parse(message.data);
      } catch {
        return;
      }
      this.handler?.change(event);
    });
    source.addEventListener('error', () => {
      if (this.source !== source) return;
      // CONNECTING: the browser reconnects by itself (with Last-Event-ID);
      // CLOSED: it gave up (no stream here). Either way, poll meanwhile.
      this.startPolling();
      if (source.readyState === EventSource.CLOSED) {
        this.source = null;
        const delay = RETRY_MS[Math.min(this.failures, RETRY_MS.length - 1)];
        this.failures += 1;
        this.retryTimer = setTimeout(() => this.handler && this.open(), delay);
      }
    });
  }

  close() {
    this.source?.close();
    this.source = null;
  }

  startPolling() {
    this.setMode('polling');
    if (this.pollTimer !== null) return;
    this.pollTimer = setInterval(() => {
      if (!document.hidden) this.handler?.refresh();
    }, POLL_MS);
  }

  stopPolling() {
    clearInterval(this.pollTimer);
    this.pollTimer = null;
  }

  setMode(mode) {
    if (mode === this.mode) return;
    this.mode = mode;
    this.onMode(mode);
  }
}
