// Test environments: a placeholder while the page is built (issue 30).

import { fill, h } from './dom.js';

export function mount(main, ctx) {
  fill(main, h('h1', { text: 'Test environments' }));
  ctx.setTitle('Test environments');
  ctx.live.stop();
  main.dataset.loaded = 'true';
  return {};
}
