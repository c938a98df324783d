import { existsSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { build } from 'esbuild';
import { chromium, type Browser } from 'playwright-core';

/** Debian's chromium, which `.ci/run` installs when missing. */
const CHROMIUM_PATH = '/usr/bin/chromium';

/** Why browser tests cannot run here, or null when they can. */
export const browserMissing: string | null = existsSync(CHROMIUM_PATH)
  ? null
  : `no browser at ${CHROMIUM_PATH} (apt-get install -y chromium; .ci/run does it)`;

if (browserMissing) console.warn(`browser tests skipped: ${browserMissing}`);

/** A real headless Chromium with no network of its own beyond what the page asks for. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM_PATH,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
    ],
  });
}

/** `entry` bundled for the browser by esbuild, as a frontend's build would do it. */
export async function bundleForBrowser(entry: string): Promise<string> {
  const result = await build({
    entryPoints: [entry],
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: 'es2022',
    write: false,
    logLevel: 'silent',
  });
  return result.outputFiles[0].text;
}

/** An IPv4 address of this machine other than loopback, or null when it has none. */
export function nonLoopbackAddress(): string | null {
  for (const list of Object.values(networkInterfaces()))
    for (const address of list ?? [])
      if (address.family === 'IPv4' && !address.internal) return address.address;
  return null;
}
