import { z } from 'zod';

/** Shared pieces of request and response schemas (snake_case on the wire, DESIGN §4). */
export const MAX_PAGE_SIZE = 500;

export const pageInput = {
  limit: z.coerce
    .number()
    .int()
    .min(1)
    .max(MAX_PAGE_SIZE)
    .default(100)
    .describe(`Page size, at most ${MAX_PAGE_SIZE}`),
  offset: z.coerce.number().int().min(0).default(0),
};

export const successOutput = z.object({ success: z.literal(true), message: z.string().optional() });

export const uuidParam = (what: string) => z.string().min(1).max(64).describe(`${what} id`);

/** A free-form JSON object (preferences, settings): plain JSON, nothing else. */
export const jsonObject = z.record(z.string(), z.unknown());

export const timestamp = z.date().describe('ISO-8601 UTC timestamp');
