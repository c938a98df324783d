import { defineEntity, p, type InferEntity } from '@mikro-orm/core';
import { timestamps, uuidPrimaryKey } from '../../db/base-entity.ts';
import { Organization } from '../users/users.entity.ts';

/**
 * An organization's LLM parameters (admin `llm-parameters`): the validated document of
 * src/llm/parameters.ts without the key, which is sealed by deps.secrets and never returned.
 */
export const LlmSettings = defineEntity({
  name: 'LlmSettings',
  tableName: 'llm_parameters',
  properties: {
    id: uuidPrimaryKey(),
    organization: () => p.manyToOne(Organization).deleteRule('cascade'),
    parameters: p.json<Record<string, unknown>>(),
    apiKeyEncrypted: p.text().nullable().hidden(),
    /** The key's last characters, so a user can tell which key is set without seeing it. */
    apiKeyHint: p.string().nullable(),
    ...timestamps(),
  },
  uniques: [{ properties: ['organization'] }],
});

export type LlmSettingsEntity = InferEntity<typeof LlmSettings>;
