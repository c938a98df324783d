/**
 * A CSV reader for what dimas and COPY write (RFC 4180 quoting: quoted cells may hold delimiters,
 * quotes and newlines; CRLF or LF rows; a last row without a newline). With `nullMarker`, an unquoted
 * cell equal to it is NULL (COPY's `\N`); a quoted one stays text.
 */
export function parseCsv(text: string): string[][];
export function parseCsv(text: string, nullMarker: string): (string | null)[][];
export function parseCsv(text: string, nullMarker?: string): (string | null)[][] {
  const rows: (string | null)[][] = [];
  let row: (string | null)[] = [];
  let field = '';
  let quoted = false;
  let wasQuoted = false;
  const endField = () => {
    row.push(!wasQuoted && nullMarker !== undefined && field === nullMarker ? null : field);
    field = '';
    wasQuoted = false;
  };
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (quoted) {
      if (ch === '"' && text[i + 1] === '"') {
        field += '"';
        i++;
      } else if (ch === '"') quoted = false;
      else field += ch;
    } else if (ch === '"') quoted = wasQuoted = true;
    else if (ch === ',') endField();
    else if (ch === '\n') {
      endField();
      rows.push(row);
      row = [];
    } else if (ch !== '\r') field += ch;
  }
  if (field || row.length) {
    endField();
    rows.push(row);
  }
  return rows;
}
