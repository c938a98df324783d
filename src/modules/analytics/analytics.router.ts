import { permissionProcedure, router } from '../../trpc/procedures.ts';
import { rest } from '../../trpc/openapi-meta.ts';
import * as s from './analytics.schemas.ts';
import * as analytics from './analytics.service.ts';
import { generateHypotheses } from './analytics-generate.service.ts';

const tag = 'analytics';
const read = permissionProcedure('workspace.read');
const run = permissionProcedure('analytics.run');
const base = '/api/analytics';

// Static paths (hypotheses/generate, hypotheses/test, insights/performance) come before parametric ones:
// the REST adapter takes the first match.
export const analyticsRouter = router({
  execute: permissionProcedure('sql.execute')
    .meta(
      rest(
        'POST',
        `${base}/execute`,
        "Execute a read-only SQL query on the workspace's target warehouse",
        tag,
      ),
    )
    .input(s.executeQueryInput)
    .output(s.executeQueryOutput)
    .mutation(({ ctx, input }) => analytics.execute(ctx, input)),

  generateHypotheses: run
    .meta(
      rest('POST', `${base}/hypotheses/generate`, 'Generate testable hypotheses from business context', tag),
    )
    .input(s.generateInput)
    .output(s.generateOutput)
    .mutation(({ ctx, input }) => generateHypotheses(ctx, input)),

  testHypothesis: run
    .meta(
      rest('POST', `${base}/hypotheses/test`, 'Test a hypothesis using a specified algorithm (a job)', tag),
    )
    .input(s.testInput)
    .output(s.runOutput)
    .mutation(({ ctx, input }) => analytics.testHypothesis(ctx, input)),

  createHypothesis: run
    .meta(rest('POST', `${base}/hypotheses`, 'Create a hypothesis specification', tag))
    .input(s.createHypothesisInput)
    .output(s.hypothesisOutput)
    .mutation(({ ctx, input }) => analytics.createHypothesis(ctx, input)),

  getHypothesis: read
    .meta(rest('GET', `${base}/hypotheses/{hypothesis_id}`, 'Get a hypothesis specification', tag))
    .input(s.hypothesisIdInput)
    .output(s.hypothesisOutput)
    .query(({ ctx, input }) => analytics.getHypothesis(ctx, input.hypothesis_id)),

  status: read
    .meta(rest('GET', `${base}/status/{hypothesis_id}`, 'Analysis execution status of a hypothesis', tag))
    .input(s.statusInput)
    .output(s.statusOutput)
    .query(({ ctx, input }) => analytics.hypothesisStatus(ctx, input.hypothesis_id, input.wait_ms)),

  miningResults: read
    .meta(
      rest(
        'GET',
        `${base}/results/mining/{hypothesis_id}`,
        'Mining results of a hypothesis: segments ranked by lift and support of its metric',
        tag,
      ),
    )
    .input(s.miningInput)
    .output(s.miningOutput)
    .query(({ ctx, input }) => analytics.miningResults(ctx, input)),

  highPerformers: read
    .meta(
      rest('GET', `${base}/insights/performance`, 'High-performing insights for closed-loop learning', tag),
    )
    .input(s.highPerformersInput)
    .output(s.highPerformersOutput)
    .query(({ ctx, input }) => analytics.highPerformers(ctx, input)),

  createInsight: run
    .meta(rest('POST', `${base}/insights`, 'Create a business insight from a significant test result', tag))
    .input(s.createInsightInput)
    .output(s.insightOutput)
    .mutation(({ ctx, input }) => analytics.createInsight(ctx, input)),

  updateInsightPerformance: run
    .meta(
      rest(
        'PUT',
        `${base}/insights/{insight_id}/performance`,
        'Update insight performance metrics from audience results',
        tag,
      ),
    )
    .input(s.performanceInput)
    .output(s.insightOutput)
    .mutation(({ ctx, input }) => analytics.updateInsightPerformance(ctx, input)),
});
