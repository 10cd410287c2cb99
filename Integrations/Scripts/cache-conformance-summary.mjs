// Summarises result files of the HTTP-caching conformance suite (http-tests/cache-tests) over the
// tests that apply to a private cache, the set the suite runs on browsers, and lists one file's
// failures. Used by cache-conformance.sh; prints Markdown.
//
//   node cache-conformance-summary.mjs SUITE_DIR NAME=RESULTS.json [NAME=RESULTS.json ...]
//       [--failures NAME] [--skip-dependencies]
//
// --failures NAME lists every private-cache test that file did not pass, each judged by its own
// result (a failed dependency is named beside it, never hides it): the work list.
//
// How a test is read (the suite's own rules, restated):
// - It applies to a private cache unless it is marked `browser_skip` (shared caches only) or
//   `cdn_only`. Tests marked `browser_only` apply.
// - Its `kind` is `required` (the default: a MUST-level behaviour), `optimal` (a SHOULD: caching
//   that ought to happen) or `check` (information only: yes or no).
// - A result is `true` (passed) or `[errorName, message]`. A `Setup` error means a step the test
//   relies on did not behave, so the test could not judge its own point; it counts apart.
// - A test whose `depends_on` tests did not all pass (or answer yes) is shown as "dependency
//   failed", as the suite's result page does. A dependency without a result in that file does not
//   block (result files from other snapshots of the suite lack the newest tests).
//   --skip-dependencies turns this off in the tables too.
import path from 'node:path'
import fs from 'node:fs'
import { pathToFileURL } from 'node:url'

const argv = process.argv.slice(2)
const suiteDir = argv.shift()
const files = []
let failuresOf
let honourDependencies = true
while (argv.length > 0) {
  const argument = argv.shift()
  if (argument === '--failures') failuresOf = argv.shift()
  else if (argument === '--skip-dependencies') honourDependencies = false
  else {
    const [name, file] = argument.includes('=') ? argument.split(/=(.*)/s) : [path.basename(argument, '.json'), argument]
    files.push({ name, results: JSON.parse(fs.readFileSync(file, 'utf8')) })
  }
}
if (!suiteDir || files.length === 0) {
  console.error('usage: node cache-conformance-summary.mjs SUITE_DIR NAME=RESULTS.json ... [--failures NAME] [--skip-dependencies]')
  process.exit(64)
}

const { default: suites } = await import(pathToFileURL(path.resolve(suiteDir, 'tests/index.mjs')).href)
const tests = new Map()
for (const suite of suites) {
  for (const test of suite.tests) tests.set(test.id, { ...test, suite })
}
const appliesToPrivateCache = test => test.browser_skip !== true && test.cdn_only !== true
const privateTests = [...tests.values()].filter(appliesToPrivateCache)
const kindOf = test => test.kind ?? 'required'

// pass | fail | optional-fail | yes | no | setup-fail | dependency-failed | untested
function outcome (results, id, dependencies = honourDependencies, seen = new Set()) {
  const test = tests.get(id)
  const result = results[id]
  if (test === undefined || result === undefined) return 'untested'
  if (dependencies && !seen.has(id)) {
    seen.add(id)
    if (failedDependencies(results, test, seen).length > 0) return 'dependency-failed'
  }
  if (Array.isArray(result) && result[0] === 'Setup') return 'setup-fail'
  const passed = result === true
  switch (kindOf(test)) {
    case 'optimal': return passed ? 'pass' : 'optional-fail'
    case 'check': return passed ? 'yes' : 'no'
    default: return passed ? 'pass' : 'fail'
  }
}

function failedDependencies (results, test, seen = new Set()) {
  return (test.depends_on ?? []).filter(id => !['pass', 'yes', 'untested'].includes(outcome(results, id, true, seen)))
}

const columns = ['pass', 'fail', 'optional-fail', 'yes', 'no', 'setup-fail', 'dependency-failed', 'untested']
function table (title, selected) {
  console.log(`\n### ${title} (${selected.length} tests)\n`)
  console.log(`| implementation | kind | ${columns.join(' | ')} |`)
  console.log(`| --- | --- | ${columns.map(() => '---:').join(' | ')} |`)
  for (const { name, results } of files) {
    for (const kind of ['required', 'optimal', 'check', 'all']) {
      const counts = Object.fromEntries(columns.map(column => [column, 0]))
      for (const test of selected) {
        if (kind !== 'all' && kindOf(test) !== kind) continue
        counts[outcome(results, test.id)] += 1
      }
      const cells = columns.map(column => counts[column] === 0 ? '' : String(counts[column]))
      console.log(`| ${kind === 'required' ? name : ''} | ${kind} | ${cells.join(' | ')} |`)
    }
  }
  console.log('\n| implementation | passed (required + optimal) | required failed | check yes |')
  console.log('| --- | ---: | ---: | ---: |')
  for (const { name, results } of files) {
    const of = wanted => selected.filter(test => outcome(results, test.id) === wanted)
    const requiredFailed = selected.filter(test => kindOf(test) === 'required' && outcome(results, test.id) === 'fail')
    console.log(`| ${name} | ${of('pass').length} | ${requiredFailed.length} | ${of('yes').length} |`)
  }
}

console.log(`# HTTP-caching conformance: private-cache tests\n`)
console.log(`Suite: ${path.resolve(suiteDir)}; ${tests.size} tests, ${privateTests.length} apply to a private cache` +
  ` (not browser_skip, not cdn_only). Dependencies ${honourDependencies ? 'honoured' : 'ignored'}.`)
table('Every private-cache test', privateTests)
const everywhere = privateTests.filter(test => files.every(({ results }) => test.id in results))
if (everywhere.length !== privateTests.length) table('Private-cache tests every file has a result for', everywhere)

// Tests whose outcome depends on the harness as much as on the cache behind it.
function harnessNote (test) {
  const notes = []
  for (const request of test.requests) {
    for (const option of ['cache', 'credentials', 'mode']) {
      if (option in request) notes.push(`fetch option \`${option}: ${request[option]}\` (a browser fetch mode; the gateway never sees it)`)
    }
    if ('expected_interim_responses' in request) notes.push('interim (1xx) responses: needs the `undici` package, and the engine has no 1xx API')
    if (request.disconnect === true) notes.push('the origin drops the connection: the gateway answers 502 for an engine error')
    const method = request.request_method ?? 'GET'
    if (!['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'].includes(method)) notes.push(`method ${method}: not an \`HTTPMethod\` case, answered 501 by the gateway`)
  }
  return [...new Set(notes)]
}

if (failuresOf !== undefined) {
  const file = files.find(({ name }) => name === failuresOf)
  if (file === undefined) throw new Error(`no result file named ${failuresOf}`)
  console.log(`\n## ${failuresOf}: private-cache tests not passed\n`)
  const groups = { fail: 'Required (MUST) failed', 'optional-fail': 'Optimal (SHOULD) not met', no: 'Check answered no', 'setup-fail': 'Setup failed (the test could not judge its point)', untested: 'No result' }
  for (const [wanted, title] of Object.entries(groups)) {
    const selected = privateTests.filter(test => outcome(file.results, test.id, false) === wanted)
    if (selected.length === 0) continue
    console.log(`\n### ${title} (${selected.length})\n`)
    for (const test of selected) {
      const anchors = test.spec_anchors ?? test.suite.spec_anchors ?? []
      const result = file.results[test.id]
      const message = Array.isArray(result) ? `${result[0]}: ${result[1]}` : 'no result'
      // Direct dependencies that failed on their own result: the suite's page hides this test behind them.
      const blocking = (test.depends_on ?? []).filter(id => !['pass', 'yes', 'untested'].includes(outcome(file.results, id, false)))
      const blockers = blocking.length > 0 ? ` (dependency not passed: ${blocking.join(', ')})` : ''
      console.log(`- \`${test.id}\` — ${test.name}`)
      console.log(`  - spec: ${anchors.length > 0 ? anchors.join(', ') : '(none given)'}; result: ${message}${blockers}`)
      for (const note of harnessNote(test)) console.log(`  - harness: ${note}`)
    }
  }
}
