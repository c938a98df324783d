/**
 * The nesting depth of JSON text, measured on the bytes before anything parses them: one pass, no
 * allocation, stopping as soon as the limit is passed. Deep documents cost parsers, validators and
 * superjson's recursive walk a stack frame per level; they are refused at the door instead.
 */

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_ARRAY = 0x5b;
const OPEN_OBJECT = 0x7b;
const CLOSE_ARRAY = 0x5d;
const CLOSE_OBJECT = 0x7d;

/** True when `json` (bytes or text) nests arrays and objects deeper than `maxDepth`. */
export function jsonDepthExceeds(json: Uint8Array | string, maxDepth: number): boolean {
  const text = typeof json === 'string';
  const length = json.length;
  let depth = 0;
  let inString = false;
  for (let i = 0; i < length; i++) {
    const c = text ? (json as string).charCodeAt(i) : (json as Uint8Array)[i];
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) inString = true;
    else if (c === OPEN_ARRAY || c === OPEN_OBJECT) {
      if (++depth > maxDepth) return true;
    } else if (c === CLOSE_ARRAY || c === CLOSE_OBJECT) depth--;
  }
  return false;
}

/** The error the body parser passes on for a too-deep body: a 400 in the JSON error shape. */
export class TooDeepError extends Error {
  readonly status = 400;
  readonly type = 'entity.too.deep';
  readonly maxDepth: number;

  constructor(maxDepth: number) {
    super(`The JSON is nested deeper than ${maxDepth} levels`);
    this.maxDepth = maxDepth;
  }
}
