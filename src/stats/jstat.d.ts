// jstat ships no type declarations; only the parts the statistics engine uses are declared.
declare module 'jstat' {
  interface JStatStatic {
    studentt: { cdf(x: number, dof: number): number; inv(p: number, dof: number): number };
    normal: {
      cdf(x: number, mean: number, sd: number): number;
      inv(p: number, mean: number, sd: number): number;
    };
    chisquare: { cdf(x: number, dof: number): number };
  }
  const jStat: { jStat: JStatStatic } & JStatStatic;
  export default jStat;
}
