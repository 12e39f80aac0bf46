// Compare two runs: a placeholder while the page is built (issue 30).

import { fill, h } from './dom.js';

export function mount(main, ctx) {
  fill(main, h('h1', { text: 'Compare two runs' }));
  ctx.setTitle('Compare two runs');
  ctx.live.stop();
  main.dataset.loaded = 'true';
  return {};
}
