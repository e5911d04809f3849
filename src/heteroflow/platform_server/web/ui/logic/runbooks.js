// The short form of each platform alert type's runbook, shown beside an alert on /alerts. Purely computational.
//
// The full page lives in the repository (docs/runbooks/platform/<TYPE>.md); the page shows its steps in the chosen
// language (i18n keys alerts.runbook.<TYPE>.<n>) and names the page. A type without a runbook shows none: never
// another type's steps.

export const RUNBOOKS = Object.freeze({
  GPU_FAULT_PREDICTED: Object.freeze({ steps: 4, path: "docs/runbooks/platform/GPU_FAULT_PREDICTED.md" }),
  GPU_MEMORY_HIGH: Object.freeze({ steps: 3, path: "docs/runbooks/platform/GPU_MEMORY_HIGH.md" }),
  NODE_CARDS_REFUSED: Object.freeze({ steps: 3, path: "docs/runbooks/platform/NODE_CARDS_REFUSED.md" }),
});

/**
 * The i18n keys of an alert type's runbook steps, in order, and the repository path of its full page;
 * null for a type without a runbook.
 * @param {string|null|undefined} type
 * @returns {{keys: string[], path: string} | null}
 */
export function runbookOf(type) {
  if (typeof type !== "string" || !Object.hasOwn(RUNBOOKS, type)) return null;
  const { steps, path } = RUNBOOKS[type];
  return { keys: Array.from({ length: steps }, (_, i) => `alerts.runbook.${type}.${i + 1}`), path };
}
