// A cron expression in words, for people: "every day at 02:00", "every 15
// minutes on weekdays". Words only: when a schedule is due is the
// service's to say (`next_runs`, `POST /schedules/preview`), never this
// file's. It covers the forms docs/schedules.md documents (numbers,
// ranges, lists, steps, names, `L`, `#`, the nicknames, six fields with
// seconds first) and answers `null` for what it cannot say plainly, so
// the page shows the expression itself instead. No imports: node's test
// runner loads it as it is.

const DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];
const MONTHS = ['January', 'February', 'March', 'April', 'May', 'June', 'July', 'August',
  'September', 'October', 'November', 'December'];
const DAY_NAMES = ['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'];
const MONTH_NAMES = ['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP', 'OCT', 'NOV', 'DEC'];
const ORDINALS = ['', 'first', 'second', 'third', 'fourth', 'fifth'];

const NICKNAMES = {
  '@yearly': 'every year on 1 January at 00:00',
  '@annually': 'every year on 1 January at 00:00',
  '@monthly': 'on day 1 of every month at 00:00',
  '@weekly': 'every Sunday at 00:00',
  '@daily': 'every day at 00:00',
  '@midnight': 'every day at 00:00',
  '@hourly': 'every hour at :00',
};

/** Thrown inside: this expression is not one to put in words. */
class Unsaid extends Error {}

/** A number of a field, by digits or (for months and weekdays) by name. */
function number(text, min, max, names) {
  const upper = text.toUpperCase();
  let n = names ? names.indexOf(upper) : -1;
  if (n >= 0) n += min;
  else if (/^\d+$/.test(text)) n = Number(text);
  else throw new Unsaid();
  if (n < min || n > max) throw new Unsaid();
  return n;
}

/**
 * One field: `{any}` for `*`/`?`, `{step, from}` for `*\/N` (or `A/N`),
 * else `{values}` (sorted, ranges expanded). `L` and `#` are handled by
 * the caller.
 */
function parseField(text, min, max, names) {
  if (text === '*' || text === '?') return { any: true };
  const step = /^(\*|\d+)\/(\d+)$/.exec(text);
  if (step) {
    const n = Number(step[2]);
    if (n < 1) throw new Unsaid();
    return { step: n, from: step[1] === '*' ? min : number(step[1], min, max) };
  }
  const values = new Set();
  for (const part of text.split(',')) {
    const range = /^([^-]+)-([^-]+)$/.exec(part);
    if (range) {
      const a = number(range[1], min, max, names);
      const b = number(range[2], min, max, names);
      if (b < a) throw new Unsaid();
      for (let i = a; i <= b; i += 1) values.add(i);
    } else {
      values.add(number(part, min, max, names));
    }
  }
  return { values: [...values].sort((x, y) => x - y) };
}

const pad = (n) => String(n).padStart(2, '0');

/** `a`, `a and b`, `a, b and c`. */
function list(items) {
  return items.length <= 1 ? items.join('') : `${items.slice(0, -1).join(', ')} and ${items.at(-1)}`;
}

/** Consecutive runs of numbers as `first–last` where three or more. */
function runs(values, name) {
  const out = [];
  for (let i = 0; i < values.length;) {
    let j = i;
    while (j + 1 < values.length && values[j + 1] === values[j] + 1) j += 1;
    if (j - i >= 2) out.push(`${name(values[i])} to ${name(values[j])}`);
    else for (let k = i; k <= j; k += 1) out.push(name(values[k]));
    i = j + 1;
  }
  return out;
}

/** The weekday part: "every Monday", "on weekdays", "on the second Friday of the month". */
function weekdays(text) {
  const nth = /^([^#]+)#([1-5])$/.exec(text);
  if (nth) return `on the ${ORDINALS[Number(nth[2])]} ${DAYS[number(nth[1], 0, 7, DAY_NAMES) % 7]} of the month`;
  const last = /^([^L]+)L$/i.exec(text);
  if (last) return `on the last ${DAYS[number(last[1], 0, 7, DAY_NAMES) % 7]} of the month`;
  const field = parseField(text, 0, 7, DAY_NAMES);
  if (field.step) throw new Unsaid();
  const days = [...new Set(field.values.map((d) => d % 7))].sort((a, b) => a - b);
  const key = days.join(',');
  if (key === '1,2,3,4,5') return 'on weekdays';
  if (key === '0,6') return 'on weekends';
  if (days.length === 7) return null;
  return `every ${list(runs(days, (d) => DAYS[d]))}`;
}

/** The day-of-month and month part: "on day 1 of every month", "on 1 January". */
function monthDays(dayText, monthText) {
  const month = parseField(monthText, 1, 12, MONTH_NAMES);
  if (month.step) throw new Unsaid();
  const monthWords = month.any ? null : list(runs(month.values, (m) => MONTHS[m - 1]));
  if (dayText === '*' || dayText === '?') return monthWords ? `in ${monthWords}` : null;
  if (dayText.toUpperCase() === 'L') return `on the last day of ${monthWords ?? 'every month'}`;
  const days = parseField(dayText, 1, 31);
  if (days.step) throw new Unsaid();
  const dayWords = list(runs(days.values, String));
  if (month.values?.length === 1) return `on ${dayWords} ${monthWords}`;
  return `on day${days.values.length > 1 ? 's' : ''} ${dayWords} of ${monthWords ?? 'every month'}`;
}

/** The time-of-day part, as an interval ("every 15 minutes") or as times ("at 02:00"). */
function timeOfDay(minuteText, hourText) {
  const minute = parseField(minuteText, 0, 59);
  const hour = parseField(hourText, 0, 23);
  const everyMinutes = (n) => (n === 1 ? 'every minute' : `every ${n} minutes`);
  if (minute.any || (minute.step && minute.from === 0 && 60 % minute.step === 0)) {
    const words = everyMinutes(minute.any ? 1 : minute.step);
    if (hour.any) return { interval: words };
    if (hour.values) {
      const hours = hour.values;
      const contiguous = hours.at(-1) - hours[0] === hours.length - 1;
      if (contiguous) return { interval: `${words} from ${pad(hours[0])}:00 to ${pad(hours.at(-1))}:59` };
      return { interval: `${words} during the hours ${list(hours.map((x) => `${pad(x)}:00`))}` };
    }
    throw new Unsaid();
  }
  if (minute.step) throw new Unsaid();
  const minutes = minute.values;
  if (hour.any) return { interval: `every hour at ${list(minutes.map((m) => `:${pad(m)}`))}` };
  if (hour.step) {
    if (hour.from !== 0 || minutes.length !== 1) throw new Unsaid();
    return { interval: `every ${hour.step === 1 ? 'hour' : `${hour.step} hours`} at :${pad(minutes[0])}` };
  }
  const times = hour.values.flatMap((x) => minutes.map((m) => `${pad(x)}:${pad(m)}`));
  if (times.length > 6) {
    const hours = hour.values;
    if (minutes.length === 1 && hours.at(-1) - hours[0] === hours.length - 1) {
      return { interval: `every hour at :${pad(minutes[0])} from ${pad(hours[0])}:${pad(minutes[0])} to ${pad(hours.at(-1))}:${pad(minutes[0])}` };
    }
    throw new Unsaid();
  }
  return { at: `at ${list(times)}` };
}

/**
 * The expression in words, or `null` when it is not one this file can
 * say (the page then shows the expression as it is).
 */
export function describeCron(expression) {
  const text = String(expression ?? '').trim();
  if (text.startsWith('@')) return NICKNAMES[text.toLowerCase()] ?? null;
  let fields = text.split(/\s+/);
  if (fields.length === 6) {
    const [seconds, ...rest] = fields;
    if (seconds !== '0') {
      // Seconds that tick: said only when the rest is every minute.
      if (rest.some((f) => f !== '*' && f !== '?')) return null;
      if (seconds === '*') return 'every second';
      const step = /^\*\/(\d+)$/.exec(seconds);
      if (step && Number(step[1]) > 0 && 60 % Number(step[1]) === 0) {
        return Number(step[1]) === 1 ? 'every second' : `every ${Number(step[1])} seconds`;
      }
      return null;
    }
    fields = rest;
  }
  if (fields.length !== 5) return null;
  const [minute, hour, dayOfMonth, month, dayOfWeek] = fields;
  try {
    const time = timeOfDay(minute, hour);
    const dates = monthDays(dayOfMonth, month);
    const days = dayOfWeek === '*' || dayOfWeek === '?' ? null : weekdays(dayOfWeek);
    // Day of month and weekday both set: either matches, as in classic cron.
    let day = dates && days ? `${dates} or ${days}` : dates ?? days;
    if (time.at) {
      if (!day) return `every day ${time.at}`;
      if (day.startsWith('in ')) day = `every day ${day}`;
      else if (/^on \d+ [A-Z]/.test(day)) day = `every year ${day}`;
      return `${day} ${time.at}`;
    }
    return day ? `${time.interval}, ${day}` : time.interval;
  } catch (e) {
    if (e instanceof Unsaid) return null;
    throw e;
  }
}
